package lock_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/lock"
	"github.com/idemkit/idem/lock/locktest"
)

func TestMemoryConformance(t *testing.T) {
	t.Parallel()
	locktest.Run(t, func(*testing.T) lock.Backend { return lock.NewMemoryBackend() })
}

// extendCall is one Extend seen by a hookBackend.
type extendCall struct {
	at       time.Time // when the call reached the backend
	ttl      time.Duration
	deadline time.Time // the call's context deadline
	err      error
	done     time.Time // when the call returned
}

// hookBackend is a MemoryBackend whose calls are recorded and may be
// changed by hooks.
type hookBackend struct {
	*lock.MemoryBackend
	// acquired is when the last successful Acquire returned: the memory
	// lease it granted ends no later than acquired + ttl.
	acquired atomic.Pointer[time.Time]
	acquires atomic.Int64
	// afterAcquire, if set, runs after each Acquire, before it returns.
	afterAcquire func()
	// extend, if set, answers Extend instead of the memory backend when
	// it returns handled.
	extend func(ctx context.Context, n int) (err error, handled bool)

	mu      sync.Mutex
	extends []extendCall
}

func newHook() *hookBackend { return &hookBackend{MemoryBackend: lock.NewMemoryBackend()} }

func (h *hookBackend) Acquire(ctx context.Context, name, owner string, ttl time.Duration) (int64, error) {
	h.acquires.Add(1)
	f, err := h.MemoryBackend.Acquire(ctx, name, owner, ttl)
	if h.afterAcquire != nil {
		h.afterAcquire()
	}
	if err == nil {
		now := time.Now()
		h.acquired.Store(&now)
	}
	return f, err
}

func (h *hookBackend) Extend(ctx context.Context, name, owner string, fence int64, ttl time.Duration) error {
	c := extendCall{at: time.Now(), ttl: ttl}
	c.deadline, _ = ctx.Deadline()
	h.mu.Lock()
	n := len(h.extends)
	h.extends = append(h.extends, c)
	h.mu.Unlock()
	err, handled := error(nil), false
	if h.extend != nil {
		err, handled = h.extend(ctx, n)
	}
	if !handled {
		err = h.MemoryBackend.Extend(ctx, name, owner, fence, ttl)
	}
	h.mu.Lock()
	h.extends[n].err, h.extends[n].done = err, time.Now()
	h.mu.Unlock()
	return err
}

func (h *hookBackend) calls() []extendCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]extendCall(nil), h.extends...)
}

// waitCalls waits until n Extend calls have returned, and returns the
// calls, or fails t after a generous deadline.
func (h *hookBackend) waitCalls(t *testing.T, n int) []extendCall {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		calls := h.calls()
		if len(calls) >= n && !calls[n-1].done.IsZero() {
			return calls
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d renewals returned, want %d", len(calls), n)
		}
	}
}

func newLocker(t *testing.T, b lock.Backend, cfg lock.Config) *lock.Locker {
	t.Helper()
	l, err := lock.New(b, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func waitDone(t *testing.T, l lock.Lease) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("Done never closed")
	}
}

// takeJob takes the lock "job", or fails t.
func takeJob(t *testing.T, l *lock.Locker) lock.Lease {
	t.Helper()
	lease, err := l.TryAcquire(t.Context(), "job")
	if err != nil {
		t.Fatal(err)
	}
	return lease
}

// heldToEnd takes the lock "job" and waits until the lease ends, with
// want as its Err.
func heldToEnd(t *testing.T, l *lock.Locker, want error) {
	t.Helper()
	lease := takeJob(t, l)
	waitDone(t, lease)
	if err := lease.Err(); !errors.Is(err, want) {
		t.Fatalf("Err = %v, want %v", err, want)
	}
}

// The watchdog renews every third of the TTL: the memory backend, which
// refuses an Extend after the lease's end, never refuses one, and
// another owner is kept out for several TTLs.
func TestWatchdogRenews(t *testing.T) {
	t.Parallel()
	const ttl = 600 * time.Millisecond
	h := newHook()
	l := newLocker(t, h, lock.Config{TTL: ttl})
	lease := takeJob(t, l)
	const hold = 4 * ttl
	end := time.Now().Add(hold)
	for time.Now().Before(end) {
		if _, err := l.TryAcquire(t.Context(), "job"); !errors.Is(err, lock.ErrHeld) {
			t.Fatalf("TryAcquire by another = %v, want ErrHeld", err)
		}
		time.Sleep(ttl / 6)
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("lease ended: %v", err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	calls := h.calls()
	for i, c := range calls {
		if c.err != nil || c.ttl != ttl {
			t.Errorf("extend %d: ttl %v, err %v; want %v, nil", i, c.ttl, c.err, ttl)
		}
	}
	// Timers never fire early: the renewals are at least a third of the
	// TTL apart, so there are at most hold/(ttl/3) + 1 of them.
	if n, most := len(calls), int(hold/(ttl/3))+1; n < 2 || n > most {
		t.Errorf("%d renewals over %v with TTL %v, want 2 to %d", n, hold, ttl, most)
	}
	for i := 1; i < len(calls); i++ {
		if gap := calls[i].at.Sub(calls[i-1].at); gap < ttl/3 {
			t.Errorf("renewals %d and %d %v apart, less than a third of the TTL", i-1, i, gap)
		}
	}
}

// An Extend that hangs, whatever its context says: the lease ends with
// ErrLost at the end of the confirmed lease, which is never later than
// the backend's; the renewal's deadline is capped at that end.
func TestWatchdogHangingExtend(t *testing.T) {
	t.Parallel()
	const ttl = 300 * time.Millisecond
	h := newHook()
	unblock := make(chan struct{})
	t.Cleanup(func() { close(unblock) })
	h.extend = func(context.Context, int) (error, bool) {
		<-unblock // ignores its context
		return nil, true
	}
	l := newLocker(t, h, lock.Config{TTL: ttl})
	t0 := time.Now()
	lease := takeJob(t, l)
	backendEnd := h.acquired.Load().Add(ttl) // the memory lease ends by then
	ctx, cancel := lease.Context(t.Context())
	defer cancel()
	// Whenever the backend's lease is surely over, the context must be
	// done, whether or not its timer has run.
	for {
		if !time.Now().Before(backendEnd) {
			if ctx.Err() == nil {
				t.Fatal("the backend's lease has ended and the lease's context is not cancelled")
			}
			break
		}
		if ctx.Err() != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	waitDone(t, lease)
	if el := time.Since(t0); el < ttl {
		t.Errorf("the lease ended %v after the acquisition was sent, before its TTL %v", el, ttl)
	}
	if !errors.Is(lease.Err(), lock.ErrLost) {
		t.Errorf("Err = %v, want ErrLost", lease.Err())
	}
	<-ctx.Done()
	if !errors.Is(context.Cause(ctx), lock.ErrLost) || !errors.Is(ctx.Err(), context.Canceled) {
		t.Errorf("context: err %v, cause %v; want Canceled, ErrLost", ctx.Err(), context.Cause(ctx))
	}
	calls := h.calls()
	if len(calls) != 1 {
		t.Fatalf("%d renewals, want the one that hangs", len(calls))
	}
	if d := calls[0].deadline; d.IsZero() || d.After(backendEnd) {
		t.Errorf("the renewal's deadline %v is not capped at the lease's end %v", d, backendEnd)
	}
}

// A renewal the backend refuses ends the lease with ErrLost; Release
// afterwards reports ErrNotHeld and leaves Err as it was.
func TestWatchdogRefused(t *testing.T) {
	t.Parallel()
	h := newHook()
	h.extend = func(context.Context, int) (error, bool) { return lock.ErrNotHeld, true }
	l := newLocker(t, h, lock.Config{TTL: 30 * time.Second})
	lease := takeJob(t, l)
	ctx, cancel := lease.Context(t.Context())
	defer cancel()
	// Make the refusal real: another owner takes the lock.
	h.MemoryBackend = lock.NewMemoryBackend()
	waitDone(t, lease)
	if !errors.Is(lease.Err(), lock.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", lease.Err())
	}
	<-ctx.Done()
	if !errors.Is(context.Cause(ctx), lock.ErrLost) {
		t.Fatalf("cause %v, want ErrLost", context.Cause(ctx))
	}
	if err := lease.Release(t.Context()); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Release after loss = %v, want ErrNotHeld", err)
	}
	if !errors.Is(lease.Err(), lock.ErrLost) {
		t.Fatalf("Err after Release = %v, want still ErrLost", lease.Err())
	}
}

// A renewal that fails (the backend unreachable) or times out (slower
// than a third of the TTL) is retried soon after, within the third of
// the lease that remains: the lease survives, and the renewals after the
// retry go on. A retry a third later, as after a success, came at the
// lease's end and lost it. The TTL is long: after a renewal that timed
// out, a third of it is all the retry has to be confirmed in, and with a
// 600 ms TTL a loaded machine missed those 200 ms.
func TestWatchdogTransientError(t *testing.T) {
	for _, c := range []struct {
		name    string
		hang    bool // the first renewal waits for its deadline
		wantErr error
	}{{"fails", false, errReset}, {"times out", true, context.DeadlineExceeded}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			const ttl = 3 * time.Second
			h := newHook()
			h.extend = func(ctx context.Context, n int) (error, bool) {
				switch {
				case n > 0:
					return nil, false
				case c.hang:
					<-ctx.Done()
					return ctx.Err(), true
				}
				return errReset, true
			}
			l := newLocker(t, h, lock.Config{TTL: ttl})
			lease := takeJob(t, l)
			// The failed renewal, its retry and the renewal after it.
			h.waitCalls(t, 3)
			if err := lease.Err(); err != nil {
				t.Fatalf("lease ended after one renewal went wrong: %v", err)
			}
			if _, err := l.TryAcquire(t.Context(), "job"); !errors.Is(err, lock.ErrHeld) {
				t.Fatalf("TryAcquire by another = %v, want ErrHeld", err)
			}
			if err := lease.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			calls := h.calls()
			if len(calls) < 3 || !errors.Is(calls[0].err, c.wantErr) || calls[1].err != nil {
				t.Fatalf("renewals %+v: want %v, then successes", calls, c.wantErr)
			}
			// The retry came right after the failure (a thirtieth of the
			// TTL), not a third of the TTL later.
			if gap := calls[1].at.Sub(calls[0].done); gap >= ttl/3 {
				t.Errorf("retry %v after the failed renewal returned; want well under a third of the TTL", gap)
			}
		})
	}
}

// errReset is a backend's transient failure.
var errReset = errors.New("connection reset")

// MaxHold: the watchdog renews no further than the maximum hold, then
// the lease runs out with ErrMaxHold and the lock is free.
func TestMaxHold(t *testing.T) {
	t.Parallel()
	// A TTL long enough that a renewal every TTL/3 is not missed by a
	// scheduler starved under -race on a loaded CI machine (300 ms lost
	// the lease there: ErrLost before the maximum hold).
	const ttl, maxHold = 900 * time.Millisecond, 3 * time.Second
	h := newHook()
	l := newLocker(t, h, lock.Config{TTL: ttl, MaxHold: maxHold})
	t0 := time.Now()
	lease := takeJob(t, l)
	ctx, cancel := lease.Context(t.Context())
	defer cancel()
	waitDone(t, lease)
	if el := time.Since(t0); el < maxHold-ttl/3 {
		t.Errorf("lease ended after %v, before the maximum hold %v allowed", el, maxHold)
	}
	if !errors.Is(lease.Err(), lock.ErrMaxHold) {
		t.Fatalf("Err = %v, want ErrMaxHold", lease.Err())
	}
	<-ctx.Done()
	if !errors.Is(context.Cause(ctx), lock.ErrMaxHold) {
		t.Fatalf("cause %v, want ErrMaxHold", context.Cause(ctx))
	}
	calls := h.calls()
	if len(calls) == 0 {
		t.Fatal("no renewal")
	}
	for i, c := range calls {
		if c.err != nil || c.ttl > ttl || c.ttl%time.Millisecond != 0 {
			t.Errorf("renewal %d: ttl %v, err %v", i, c.ttl, c.err)
		}
	}
	if last := calls[len(calls)-1]; last.ttl == ttl {
		t.Errorf("the last renewal asked for the whole TTL: the maximum hold did not shorten it")
	}
	// No renewal after Done: the lock runs out.
	n := len(calls)
	next, err := l.Acquire(t.Context(), "job")
	if err != nil {
		t.Fatal(err)
	}
	if next.Fence() != lease.Fence()+1 {
		t.Errorf("fence %d, want %d", next.Fence(), lease.Fence()+1)
	}
	if got := len(h.calls()); got > n+3 {
		t.Errorf("%d renewals after the maximum hold", got-n)
	}
}

// A renewal the maximum hold shortened whose answer comes back when less
// than a third of the TTL remains is the last: the lease ends at the
// maximum hold with ErrMaxHold, not ErrLost. (The watchdog once set its
// timer to the end of that renewal without marking it final, and the
// timer found the lease ended "without a renewal in time".) The first
// renewal fails, so the second is shortened by the maximum hold; it is
// answered late, within its deadline.
func TestMaxHoldAfterLateShortenedRenewal(t *testing.T) {
	t.Parallel()
	const ttl, maxHold, late = 1800 * time.Millisecond, 2 * time.Second, 300 * time.Millisecond
	h := newHook()
	h.extend = func(_ context.Context, n int) (error, bool) {
		switch n {
		case 0:
			return errors.New("backend unreachable"), true
		case 1:
			time.Sleep(late)
		}
		return nil, false
	}
	l := newLocker(t, h, lock.Config{TTL: ttl, MaxHold: maxHold, Logger: slog.New(slog.DiscardHandler)})
	heldToEnd(t, l, lock.ErrMaxHold)
	calls := h.calls()
	if len(calls) != 2 {
		t.Fatalf("%d renewals, want 2 (one failed, one shortened by the maximum hold)", len(calls))
	}
	if calls[1].err != nil || calls[1].ttl >= ttl {
		t.Fatalf("second renewal: ttl %v, err %v; want a shortened ttl, answered", calls[1].ttl, calls[1].err)
	}
}

// Acquire waits while the lock is held, backing off, and gets it after
// the release; a context that ends first gives ErrHeld and the context's
// error.
func TestAcquireRetries(t *testing.T) {
	t.Parallel()
	h := newHook()
	l := newLocker(t, h, lock.Config{TTL: time.Minute, RetryMin: 10 * time.Millisecond, RetryMax: 40 * time.Millisecond})
	first, err := l.TryAcquire(t.Context(), "job")
	if err != nil {
		t.Fatal(err)
	}

	short, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, err := l.Acquire(short, "job"); !errors.Is(err, lock.ErrHeld) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with a context that ends = %v, want ErrHeld and DeadlineExceeded", err)
	}

	const hold = 300 * time.Millisecond
	released := make(chan time.Time, 1)
	go func() {
		time.Sleep(hold)
		released <- time.Now()
		_ = first.Release(context.Background())
	}()
	before := h.acquires.Load()
	start := time.Now()
	second, err := l.Acquire(t.Context(), "job")
	if err != nil {
		t.Fatal(err)
	}
	waited := time.Since(start)
	if at := <-released; time.Now().Before(at) {
		t.Fatal("acquired before the release")
	}
	if second.Fence() <= first.Fence() {
		t.Fatalf("fence %d, want > %d", second.Fence(), first.Fence())
	}
	// Each wait is at least RetryMin/2: the attempts are bounded.
	if n, most := h.acquires.Load()-before, int64(waited/(5*time.Millisecond))+1; n < 2 || n > most {
		t.Errorf("%d attempts in %v, want 2 to %d", n, waited, most)
	}
	_ = second.Release(t.Context())
}

// An Acquire answered after the TTL brings a lease already over: it is
// released and the attempt reported as failed.
func TestAcquireAnsweredTooLate(t *testing.T) {
	t.Parallel()
	const ttl = 50 * time.Millisecond
	h := newHook()
	var slow atomic.Bool
	slow.Store(true)
	h.afterAcquire = func() {
		if slow.Load() {
			time.Sleep(2 * ttl) // the answer is delayed past the TTL
		}
	}
	l := newLocker(t, h, lock.Config{TTL: ttl})
	if _, err := l.TryAcquire(t.Context(), "job"); err == nil {
		t.Fatal("TryAcquire answered after the TTL succeeded")
	}
	slow.Store(false)
	// The lock was given back: another owner gets it at once, fence 2.
	o := lock.NewOwner()
	f, err := h.MemoryBackend.Acquire(t.Context(), "job", o, time.Minute)
	if err != nil || f != 2 {
		t.Fatalf("Acquire after the late answer = %d, %v; want 2, nil", f, err)
	}
}

func TestReleaseTwice(t *testing.T) {
	t.Parallel()
	l := newLocker(t, lock.NewMemoryBackend(), lock.Config{})
	lease := takeJob(t, l)
	ctx, cancel := lease.Context(t.Context())
	defer cancel()
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() == nil {
		t.Fatal("context not cancelled by Release")
	}
	if !errors.Is(context.Cause(ctx), lock.ErrReleased) {
		t.Fatalf("cause %v, want ErrReleased", context.Cause(ctx))
	}
	if err := lease.Release(t.Context()); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("second Release = %v, want ErrNotHeld", err)
	}
}

// Cancelling a derived context leaves the lease and other contexts alone.
func TestContextCancelFunc(t *testing.T) {
	t.Parallel()
	l := newLocker(t, lock.NewMemoryBackend(), lock.Config{})
	lease := takeJob(t, l)
	a, cancelA := lease.Context(t.Context())
	b, cancelB := lease.Context(t.Context())
	defer cancelB()
	cancelA()
	if a.Err() == nil || b.Err() != nil || lease.Err() != nil {
		t.Fatalf("after cancelling one context: %v, %v, lease %v", a.Err(), b.Err(), lease.Err())
	}
	_ = lease.Release(t.Context())
	<-b.Done()
}

func TestNew(t *testing.T) {
	t.Parallel()
	m := lock.NewMemoryBackend()
	l, err := lock.New(m, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := l.Config(); c.TTL != lock.DefaultTTL || c.MaxHold != lock.DefaultMaxHold || c.RetryMin != lock.DefaultRetryMin || c.RetryMax != lock.DefaultRetryMax || c.Logger == nil {
		t.Fatalf("defaults: %+v", c)
	}
	bad := []struct {
		name string
		b    lock.Backend
		cfg  lock.Config
	}{
		{"nil backend", nil, lock.Config{}},
		{"negative TTL", m, lock.Config{TTL: -1}},
		{"TTL under 3ms", m, lock.Config{TTL: time.Millisecond}},
		{"MaxHold under TTL", m, lock.Config{TTL: time.Minute, MaxHold: time.Second}},
		{"negative RetryMin", m, lock.Config{RetryMin: -1}},
		{"RetryMax under RetryMin", m, lock.Config{RetryMin: time.Second, RetryMax: time.Millisecond}},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if _, err := lock.New(c.b, &c.cfg); err == nil {
				t.Fatal("New accepted it")
			}
		})
	}
	if l, err := lock.New(m, &lock.Config{MaxHold: -1}); err != nil || l.Config().MaxHold >= 0 {
		t.Fatalf("MaxHold -1 (no cap): %v", err)
	}
}

func TestValidateName(t *testing.T) {
	t.Parallel()
	l := newLocker(t, lock.NewMemoryBackend(), lock.Config{})
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"", false},
		{"job", true},
		{strings.Repeat("x", lock.MaxNameLen), true},
		{strings.Repeat("x", lock.MaxNameLen+1), false},
		{"a\x00b", false},
		{"a\nb", false},
		{"a\x7f", false},
		{"\xff", false},
		{"ключ 🔒", true},
	} {
		err := lock.ValidateName(c.name)
		if (err == nil) != c.ok {
			t.Errorf("ValidateName(%q) = %v, want ok %v", c.name, err, c.ok)
		}
		if !c.ok {
			if !errors.Is(err, lock.ErrInvalidName) {
				t.Errorf("ValidateName(%q) = %v, want ErrInvalidName", c.name, err)
			}
			if _, err := l.TryAcquire(t.Context(), c.name); !errors.Is(err, lock.ErrInvalidName) {
				t.Errorf("TryAcquire(%q) = %v, want ErrInvalidName", c.name, err)
			}
			if _, err := l.Acquire(t.Context(), c.name); !errors.Is(err, lock.ErrInvalidName) {
				t.Errorf("Acquire(%q) = %v, want ErrInvalidName", c.name, err)
			}
		}
	}
}

func FuzzValidateName(f *testing.F) {
	for _, s := range append([]string{"", "a", "a\x00", "\xff"}, locktest.HostileNames...) {
		f.Add(s)
	}
	m := lock.NewMemoryBackend()
	l, err := lock.New(m, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if lock.ValidateName(name) != nil {
			return
		}
		lease, err := l.TryAcquire(context.Background(), name)
		if err != nil {
			t.Fatalf("TryAcquire(%q): %v", name, err)
		}
		if lease.Name() != name {
			t.Fatalf("Name() = %q", lease.Name())
		}
		if err := lease.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

func TestNewOwner(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		o := lock.NewOwner()
		if len(o) != 32 || seen[o] {
			t.Fatalf("owner %q: length %d, or a repeat", o, len(o))
		}
		seen[o] = true
	}
}

func TestPGAdvisoryKey(t *testing.T) {
	t.Parallel()
	// sha256("job") begins 5e8c9902207afaeb. sqlstore's tests check the
	// SQL of PGAdvisoryKey's doc against it on PostgreSQL.
	if k := lock.PGAdvisoryKey("job"); k != 0x5e8c9902207afaeb {
		t.Fatalf("PGAdvisoryKey(job) = %x", k)
	}
	if lock.PGAdvisoryKey("job") == lock.PGAdvisoryKey("job ") {
		t.Fatal("job and job  share a key")
	}
}

// A renewal the maximum hold shortened that fails is not the last: the
// next one, shortened too, is; the lease then ends with ErrMaxHold.
func TestMaxHoldShortenedRenewalFails(t *testing.T) {
	t.Parallel()
	// The first renewal (after a third of the TTL) is already shortened;
	// the second comes 600 ms before the lease's end.
	const ttl, maxHold = 1800 * time.Millisecond, 2400 * time.Millisecond
	h := newHook()
	h.extend = func(_ context.Context, n int) (error, bool) {
		if n == 0 {
			return errors.New("backend unreachable"), true
		}
		return nil, false
	}
	l := newLocker(t, h, lock.Config{TTL: ttl, MaxHold: maxHold})
	heldToEnd(t, l, lock.ErrMaxHold)
	calls := h.calls()
	if len(calls) != 2 || calls[0].err == nil || calls[1].err != nil {
		t.Fatalf("renewals %+v: want a failure, then one answered", calls)
	}
	for i, c := range calls {
		if c.ttl >= ttl {
			t.Errorf("renewal %d asked for %v, want less than the TTL", i, c.ttl)
		}
	}
}

// A renewal the maximum hold shortened that the backend refuses ends
// the lease with ErrLost, not ErrMaxHold: it may have ended before.
func TestMaxHoldShortenedRenewalRefused(t *testing.T) {
	t.Parallel()
	const ttl, maxHold = 900 * time.Millisecond, 1200 * time.Millisecond
	h := newHook()
	h.extend = func(context.Context, int) (error, bool) { return lock.ErrNotHeld, true }
	l := newLocker(t, h, lock.Config{TTL: ttl, MaxHold: maxHold})
	lease := takeJob(t, l)
	ctx, cancel := lease.Context(t.Context())
	defer cancel()
	waitDone(t, lease)
	if !errors.Is(lease.Err(), lock.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", lease.Err())
	}
	<-ctx.Done()
	if !errors.Is(context.Cause(ctx), lock.ErrLost) {
		t.Fatalf("cause %v, want ErrLost", context.Cause(ctx))
	}
	if calls := h.calls(); len(calls) != 1 || calls[0].ttl >= ttl {
		t.Fatalf("renewals %+v: want one, shortened", calls)
	}
}

// A renewal the maximum hold shortened whose answer comes after Release
// changes nothing: the lease stays released, Release's cancel reached the
// renewal, and the watchdog does not run again.
func TestMaxHoldShortenedRenewalAnsweredAfterRelease(t *testing.T) {
	t.Parallel()
	const ttl, maxHold = 900 * time.Millisecond, 1200 * time.Millisecond
	h := newHook()
	entered, answer := make(chan struct{}), make(chan struct{})
	cancelled := make(chan bool, 1)
	h.extend = func(ctx context.Context, n int) (error, bool) {
		if n == 0 {
			close(entered)
			<-answer // ignores its context until told
			cancelled <- ctx.Err() != nil
		}
		return nil, true // answered as if the backend had renewed it
	}
	l := newLocker(t, h, lock.Config{TTL: ttl, MaxHold: maxHold})
	lease := takeJob(t, l)
	ctx, cancel := lease.Context(t.Context())
	defer cancel()
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no renewal")
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	close(answer)
	select {
	case c := <-cancelled:
		if !c {
			t.Error("Release did not cancel the renewal in flight")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the renewal never returned")
	}
	// Past the end the renewal would have confirmed: still released.
	time.Sleep(maxHold)
	if !errors.Is(lease.Err(), lock.ErrReleased) || !errors.Is(context.Cause(ctx), lock.ErrReleased) {
		t.Fatalf("Err %v, context cause %v; want ErrReleased", lease.Err(), context.Cause(ctx))
	}
	if n := len(h.calls()); n != 1 {
		t.Fatalf("%d renewals, want 1", n)
	}
}

// MaxHold equal to the TTL: no renewal could extend the lease, none is
// sent, and the lease runs out with ErrMaxHold.
func TestMaxHoldEqualsTTL(t *testing.T) {
	t.Parallel()
	const ttl = 300 * time.Millisecond
	h := newHook()
	l := newLocker(t, h, lock.Config{TTL: ttl, MaxHold: ttl})
	t0 := time.Now()
	lease := takeJob(t, l)
	waitDone(t, lease)
	if el := time.Since(t0); el < ttl {
		t.Errorf("the lease ended %v after the acquisition was sent, before its TTL %v", el, ttl)
	}
	if !errors.Is(lease.Err(), lock.ErrMaxHold) {
		t.Fatalf("Err = %v, want ErrMaxHold", lease.Err())
	}
	if n := len(h.calls()); n != 0 {
		t.Fatalf("%d renewals, want none", n)
	}
}

// A backend that fails at once is retried with a backoff, not in a tight
// loop: from a thirtieth of the TTL, doubling.
func TestWatchdogRetryBackoff(t *testing.T) {
	t.Parallel()
	const ttl = 1500 * time.Millisecond
	h := newHook()
	h.extend = func(context.Context, int) (error, bool) { return errors.New("connection refused"), true }
	l := newLocker(t, h, lock.Config{TTL: ttl})
	heldToEnd(t, l, lock.ErrLost)
	calls := h.calls()
	// At a third of the TTL (500 ms), then 50, 100, 200 and 400 ms
	// later; the lease's end at 1500 ms cuts the rest: 5 attempts, or
	// fewer on a timer hundreds of milliseconds late, never dozens.
	// (Retried only a third later, there were 2.)
	if n := len(calls); n < 3 || n > 8 {
		t.Fatalf("%d renewal attempts in one TTL against a failing backend; want 3 to 8", n)
	}
}
