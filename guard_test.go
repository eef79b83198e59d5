package idem_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
)

// hookStore is a store whose Acquire, Extend, Complete and Release may be
// replaced.
type hookStore struct {
	idem.Store
	acquire  func(ctx context.Context, req idem.AcquireRequest) (idem.AcquireResult, error)
	extend   func(ctx context.Context, l idem.Lease, ttl time.Duration) (idem.Lease, error)
	complete func(ctx context.Context, l idem.Lease, resp idem.Response, retention time.Duration) error
	release  func(ctx context.Context, l idem.Lease) error
	extends  atomic.Int64 // Extend calls
	renewed  atomic.Int64 // Extend calls that returned no error
}

func (s *hookStore) Acquire(ctx context.Context, req idem.AcquireRequest) (idem.AcquireResult, error) {
	if s.acquire != nil {
		return s.acquire(ctx, req)
	}
	return s.Store.Acquire(ctx, req)
}

func (s *hookStore) Release(ctx context.Context, l idem.Lease) error {
	if s.release != nil {
		return s.release(ctx, l)
	}
	return s.Store.Release(ctx, l)
}

// txHookStore is a hookStore that completes "in a transaction" through
// its completeTx hook (the transaction itself is not used).
type txHookStore struct {
	*hookStore
	completeTx func(ctx context.Context, tx *sql.Tx, l idem.Lease, resp idem.Response, retention time.Duration) error
}

func (s *txHookStore) CompleteTx(ctx context.Context, tx *sql.Tx, l idem.Lease, resp idem.Response, retention time.Duration) error {
	return s.completeTx(ctx, tx, l, resp, retention)
}

func (s *hookStore) Extend(ctx context.Context, l idem.Lease, ttl time.Duration) (idem.Lease, error) {
	s.extends.Add(1)
	var nl idem.Lease
	var err error
	if s.extend != nil {
		nl, err = s.extend(ctx, l, ttl)
	} else {
		nl, err = s.Store.Extend(ctx, l, ttl)
	}
	if err == nil {
		s.renewed.Add(1)
	}
	return nl, err
}

func (s *hookStore) Complete(ctx context.Context, l idem.Lease, resp idem.Response, retention time.Duration) error {
	if s.complete != nil {
		return s.complete(ctx, l, resp, retention)
	}
	return s.Store.Complete(ctx, l, resp, retention)
}

func newGuard(t *testing.T, s idem.Store, cfg *idem.GuardConfig) *idem.Guard {
	t.Helper()
	g, err := idem.NewGuard(s, cfg)
	if err != nil {
		t.Fatalf("NewGuard: %v", err)
	}
	return g
}

func begin(t *testing.T, g *idem.Guard, key string) *idem.Execution {
	t.Helper()
	exec, res, err := g.Begin(t.Context(), "scope", key, "fp")
	if err != nil || res.Outcome != idem.Acquired || exec == nil {
		t.Fatalf("Begin(%q) = %v, %v, %v; want an execution", key, exec, res.Outcome, err)
	}
	return exec
}

// waitDone waits for ctx to end and returns its cause.
func waitDone(t *testing.T, ctx context.Context, within time.Duration) error {
	t.Helper()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(within):
		t.Fatalf("context not done after %v", within)
		return nil
	}
}

func TestNewGuard(t *testing.T) {
	t.Parallel()
	s := memstore.New(nil)
	for _, tc := range []struct {
		name string
		s    idem.Store
		cfg  *idem.GuardConfig
		err  string // "" means valid
	}{
		{"nil store", nil, nil, "needs a store"},
		{"negative lease", s, &idem.GuardConfig{Lease: -time.Second}, "negative"},
		{"negative max execution", s, &idem.GuardConfig{MaxExecution: -time.Second}, "negative"},
		{"negative retention", s, &idem.GuardConfig{Retention: -time.Second}, "negative"},
		{"lease under 3ms", s, &idem.GuardConfig{Lease: 2 * time.Millisecond}, "shorter than 3ms"},
		{"lease 1ns", s, &idem.GuardConfig{Lease: 1}, "shorter than 3ms"},
		{"lease 3ms", s, &idem.GuardConfig{Lease: 3 * time.Millisecond}, ""},
		{"nil config", s, nil, ""},
		{"zero config", s, &idem.GuardConfig{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := idem.NewGuard(tc.s, tc.cfg)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || g != nil {
					t.Fatalf("NewGuard = %v, %v; want nil and an error containing %q", g, err, tc.err)
				}
				return
			}
			if err != nil || g == nil {
				t.Fatalf("NewGuard: %v", err)
			}
		})
	}
}

func TestNewGuardDefaults(t *testing.T) {
	t.Parallel()
	s := memstore.New(nil)
	for _, cfg := range []*idem.GuardConfig{nil, {}} {
		g := newGuard(t, s, cfg)
		c := g.Config()
		if c.Lease != idem.DefaultLease || c.MaxExecution != idem.DefaultMaxExecution || c.Retention != idem.DefaultRetention || c.Logger == nil {
			t.Errorf("NewGuard(%v).Config() = %+v, want the defaults and a logger", cfg, c)
		}
		if g.Store() != s {
			t.Errorf("Store() = %v, want the store given", g.Store())
		}
	}

	// The config is copied and only zero fields are filled.
	logger := slog.New(slog.DiscardHandler)
	cfg := &idem.GuardConfig{Lease: time.Second, MaxExecution: time.Minute, Retention: time.Hour, Logger: logger}
	g := newGuard(t, s, cfg)
	cfg.Lease = time.Hour
	if c := g.Config(); c.Lease != time.Second || c.MaxExecution != time.Minute || c.Retention != time.Hour || c.Logger != logger {
		t.Errorf("Config() = %+v, want the config given, unaffected by later changes", c)
	}
}

func TestGuardBegin(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := memstore.New(nil)
	g := newGuard(t, s, &idem.GuardConfig{Retention: time.Hour})

	exec := begin(t, g, "k")
	l := exec.Lease()
	if l.Scope != "scope" || l.Key != "k" || l.Fence != 1 || l.Owner == "" {
		t.Fatalf("Lease() = %+v", l)
	}
	if exec.Retention() != time.Hour {
		t.Errorf("Retention() = %v, want 1h", exec.Retention())
	}
	if idem.FromContext(exec.Context()) != exec {
		t.Error("FromContext(exec.Context()) is not the execution")
	}
	if idem.FromContext(ctx) != nil {
		t.Error("FromContext of a context without execution is not nil")
	}
	if _, ok, err := exec.Committed(ctx); ok || err != nil {
		t.Errorf("Committed without CompleteTx = %v, %v; want false, nil", ok, err)
	}

	other, res, err := g.Begin(ctx, "scope", "k", "fp")
	if err != nil || other != nil || res.Outcome != idem.InFlight || res.Record.Fence != 1 {
		t.Fatalf("second Begin = %v, %v, %v; want no execution, in flight", other, res.Outcome, err)
	}
	if _, res, _ := g.Begin(ctx, "scope", "k", "other"); res.Outcome != idem.Mismatch {
		t.Fatalf("Begin with another fingerprint = %v, want mismatch", res.Outcome)
	}

	resp := idem.Response{StatusCode: 201, Body: []byte("done")}
	if err := exec.Complete(ctx, resp); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if cause := waitDone(t, exec.Context(), time.Second); !errors.Is(cause, context.Canceled) {
		t.Errorf("context cause after Complete = %v, want context.Canceled", cause)
	}
	if err := exec.Complete(ctx, resp); !errors.Is(err, idem.ErrFinished) {
		t.Errorf("second Complete = %v, want ErrFinished", err)
	}
	if err := exec.Release(ctx); !errors.Is(err, idem.ErrFinished) {
		t.Errorf("Release after Complete = %v, want ErrFinished", err)
	}
	exec.Abandon() // a no-op on a finished execution

	replay, res, err := g.Begin(ctx, "scope", "k", "fp")
	if err != nil || replay != nil || res.Outcome != idem.Completed || string(res.Record.Response.Body) != "done" {
		t.Fatalf("Begin after Complete = %v, %v, %v; want the completed record", replay, res.Outcome, err)
	}
}

func TestGuardBeginInvalid(t *testing.T) {
	t.Parallel()
	g := newGuard(t, memstore.New(nil), nil)
	if _, _, err := g.Begin(t.Context(), "scope", "", "fp"); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("Begin with an empty key = %v, want ErrInvalidKey", err)
	}
	if _, _, err := g.Begin(t.Context(), "scope\n", "k", "fp"); !errors.Is(err, idem.ErrInvalidScope) {
		t.Errorf("Begin with a bad scope = %v, want ErrInvalidScope", err)
	}
	if _, _, err := g.Do(t.Context(), "scope", strings.Repeat("k", 256), "fp", func(context.Context) (idem.Response, error) {
		t.Error("work ran")
		return idem.Response{}, nil
	}); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("Do with a long key = %v, want ErrInvalidKey", err)
	}
}

func TestGuardRelease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := memstore.New(nil)
	g := newGuard(t, s, nil)
	exec := begin(t, g, "k")
	if err := exec.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := s.Get(ctx, "scope", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get after Release = %v, want ErrNotFound", err)
	}
	if err := exec.Complete(ctx, idem.Response{}); !errors.Is(err, idem.ErrFinished) {
		t.Errorf("Complete after Release = %v, want ErrFinished", err)
	}
	if again := begin(t, g, "k"); again.Lease().Fence != 1 {
		t.Errorf("fence after Release = %d, want 1", again.Lease().Fence)
	} else {
		again.Abandon()
	}
}

func TestGuardDoOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	g := newGuard(t, memstore.New(nil), nil)
	var effects atomic.Int64
	want := idem.Response{StatusCode: 201, Header: map[string][]string{"Content-Type": {"text/plain"}}, Body: []byte("charged")}
	work := func(ctx context.Context) (idem.Response, error) {
		effects.Add(1)
		time.Sleep(20 * time.Millisecond)
		return want, nil
	}

	const n = 100
	var (
		wg                     sync.WaitGroup
		ran, replays, inFlight atomic.Int64
		start                  = make(chan struct{})
	)
	for range n {
		wg.Go(func() {
			<-start
			resp, replayed, err := g.Do(ctx, "scope", "charge-1", "fp", work)
			switch {
			case errors.Is(err, idem.ErrInFlight):
				inFlight.Add(1)
			case err != nil:
				t.Errorf("Do: %v", err)
			case replayed:
				replays.Add(1)
				if string(resp.Body) != "charged" || resp.StatusCode != 201 {
					t.Errorf("replayed %+v, want %+v", resp, want)
				}
			default:
				ran.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if effects.Load() != 1 || ran.Load() != 1 || ran.Load()+replays.Load()+inFlight.Load() != n {
		t.Fatalf("effects %d, ran %d, replays %d, in flight %d; want 1 effect and %d answers", effects.Load(), ran.Load(), replays.Load(), inFlight.Load(), n)
	}

	resp, replayed, err := g.Do(ctx, "scope", "charge-1", "fp", work)
	if err != nil || !replayed || string(resp.Body) != "charged" || effects.Load() != 1 {
		t.Fatalf("Do after completion = %+v, %v, %v (effects %d); want a replay", resp, replayed, err, effects.Load())
	}
	if _, _, err := g.Do(ctx, "scope", "charge-1", "other", work); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("Do with another fingerprint = %v, want ErrMismatch", err)
	}
}

func TestGuardDoInFlight(t *testing.T) {
	t.Parallel()
	g := newGuard(t, memstore.New(nil), nil)
	exec := begin(t, g, "k")
	defer exec.Abandon()
	_, _, err := g.Do(t.Context(), "scope", "k", "fp", func(context.Context) (idem.Response, error) {
		t.Error("work ran while another execution holds the key")
		return idem.Response{}, nil
	})
	if !errors.Is(err, idem.ErrInFlight) {
		t.Fatalf("Do = %v, want ErrInFlight", err)
	}
}

func TestGuardDoWorkError(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := memstore.New(nil)
	g := newGuard(t, s, nil)
	var runs atomic.Int64
	errBoom := errors.New("boom")
	work := func(ctx context.Context) (idem.Response, error) {
		if runs.Add(1) == 1 {
			return idem.Response{StatusCode: 500}, errBoom
		}
		return idem.Response{StatusCode: 200, Body: []byte("second try")}, nil
	}
	resp, replayed, err := g.Do(ctx, "scope", "k", "fp", work)
	if !errors.Is(err, errBoom) || replayed || resp.StatusCode != 0 {
		t.Fatalf("Do = %+v, %v, %v; want the work's error", resp, replayed, err)
	}
	if _, err := s.Get(ctx, "scope", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get after a failed work = %v, want ErrNotFound (released)", err)
	}
	resp, replayed, err = g.Do(ctx, "scope", "k", "fp", work)
	if err != nil || replayed || string(resp.Body) != "second try" || runs.Load() != 2 {
		t.Fatalf("retry = %+v, %v, %v (runs %d); want work to run again", resp, replayed, err, runs.Load())
	}
}

func TestGuardDoPanic(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := memstore.New(nil)
	g := newGuard(t, s, nil)
	func() {
		defer func() {
			if r := recover(); r != "work exploded" {
				t.Errorf("recovered %v, want the work's panic", r)
			}
		}()
		_, _, _ = g.Do(ctx, "scope", "k", "fp", func(context.Context) (idem.Response, error) {
			panic("work exploded")
		})
		t.Error("Do returned although work panicked")
	}()
	if _, err := s.Get(ctx, "scope", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get after a panic = %v, want ErrNotFound (released)", err)
	}
	var ran bool
	if _, _, err := g.Do(ctx, "scope", "k", "fp", func(context.Context) (idem.Response, error) {
		ran = true
		return idem.Response{StatusCode: 200}, nil
	}); err != nil || !ran {
		t.Fatalf("retry after a panic: ran %v, %v", ran, err)
	}
}

func TestGuardDoCompletionFails(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	errDown := errors.New("store down")
	s := &hookStore{Store: memstore.New(nil), complete: func(context.Context, idem.Lease, idem.Response, time.Duration) error { return errDown }}
	g := newGuard(t, s, nil)
	resp, replayed, err := g.Do(ctx, "scope", "k", "fp", func(context.Context) (idem.Response, error) {
		return idem.Response{StatusCode: 200, Body: []byte("effect happened")}, nil
	})
	if !errors.Is(err, errDown) || replayed || string(resp.Body) != "effect happened" {
		t.Fatalf("Do = %+v, %v, %v; want the work's response and the store's error", resp, replayed, err)
	}
	// The record is left to its lease: a retry does not run the effect now.
	rec, err := s.Get(ctx, "scope", "k")
	if err != nil || rec.Status != idem.StatusProcessing {
		t.Fatalf("record = %+v, %v; want processing", rec, err)
	}
}

func TestGuardWatchdogRenews(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := &hookStore{Store: memstore.New(nil)}
	// Long enough that a renewal every lease/3 survives a starved
	// scheduler (-race on a loaded 2-core CI machine): each renewal has
	// two thirds of the lease, 600 ms, to be confirmed. (With 300 ms, a
	// timer 200 ms late lost the lease.)
	const lease = 900 * time.Millisecond
	g := newGuard(t, s, &idem.GuardConfig{Lease: lease})

	stop := make(chan struct{})
	var (
		wg       sync.WaitGroup
		probes   atomic.Int64
		workDone atomic.Bool
	)
	wg.Go(func() {
		// A duplicate keeps knocking while the work runs; the lease must
		// never lapse.
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			exec, res, err := g.Begin(ctx, "scope", "slow", "fp")
			probes.Add(1)
			if err == nil && res.Outcome == idem.Completed && workDone.Load() {
				return
			}
			if err != nil || res.Outcome != idem.InFlight {
				t.Errorf("duplicate Begin while the work runs = %v, %v; want in flight", res.Outcome, err)
				if exec != nil {
					exec.Abandon()
				}
				return
			}
		}
	})
	resp, _, err := g.Do(ctx, "scope", "slow", "fp", func(ctx context.Context) (idem.Response, error) {
		select {
		case <-time.After(3 * lease):
		case <-ctx.Done():
			return idem.Response{}, context.Cause(ctx)
		}
		workDone.Store(true)
		return idem.Response{StatusCode: 200}, nil
	})
	close(stop)
	wg.Wait()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("Do = %+v, %v", resp, err)
	}
	rec, err := s.Get(ctx, "scope", "slow")
	if err != nil || rec.Status != idem.StatusCompleted || rec.Fence != 1 {
		t.Fatalf("record = %+v, %v; want completed with fence 1", rec, err)
	}
	if n := s.renewed.Load(); n < 3 {
		t.Errorf("the watchdog renewed %d times in 3 leases, want at least 3", n)
	}
	if probes.Load() < 10 {
		t.Errorf("only %d duplicate probes ran", probes.Load())
	}
}

func TestGuardLeaseLost(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := &hookStore{Store: memstore.New(nil), extend: func(context.Context, idem.Lease, time.Duration) (idem.Lease, error) {
		return idem.Lease{}, idem.ErrLeaseLost
	}}
	g := newGuard(t, s, &idem.GuardConfig{Lease: 30 * time.Millisecond})
	exec := begin(t, g, "k")
	defer exec.Abandon()
	if cause := waitDone(t, exec.Context(), 2*time.Second); !errors.Is(cause, idem.ErrLeaseLost) {
		t.Fatalf("context cause = %v, want ErrLeaseLost", cause)
	}
	if !errors.Is(exec.Context().Err(), context.Canceled) {
		t.Errorf("context error = %v, want context.Canceled", exec.Context().Err())
	}

	// Do hands the cancelled context to work and reports its error.
	_, _, err := g.Do(ctx, "scope", "k2", "fp", func(ctx context.Context) (idem.Response, error) {
		<-ctx.Done()
		return idem.Response{}, context.Cause(ctx)
	})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Do = %v, want ErrLeaseLost", err)
	}
}

// lostObserver records, for each lease lost it is told, whether the
// execution's context had ended by then.
type lostObserver struct {
	mu   sync.Mutex
	live []bool // ctx.Err() == nil at each OutcomeLost
}

func (o *lostObserver) Start(ctx context.Context, _ idem.Event) context.Context { return ctx }

func (o *lostObserver) End(ctx context.Context, e idem.Event) {
	if e.Kind == idem.KindLease && e.Outcome == idem.OutcomeLost {
		o.mu.Lock()
		o.live = append(o.live, ctx.Err() == nil)
		o.mu.Unlock()
	}
}

// Once the guard knows the lease is lost, the execution's context says
// so to every goroutine of the work before anything else happens: here
// the observer told of the loss by a completion the store refused finds
// the context ended. (The context was cancelled after the guard let go of
// its lock, so work could check Err, find it nil and go on with its
// effect meanwhile, on a loaded machine for as long as the goroutine
// that was to cancel it waited for a CPU.)
func TestGuardContextEndsWithLoss(t *testing.T) {
	t.Parallel()
	s := &hookStore{Store: memstore.New(nil), complete: func(context.Context, idem.Lease, idem.Response, time.Duration) error {
		return idem.ErrLeaseLost
	}}
	obs := &lostObserver{}
	g := newGuard(t, s, &idem.GuardConfig{Observer: obs})
	exec := begin(t, g, "k")
	if err := exec.Complete(t.Context(), idem.Response{StatusCode: 201}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Complete = %v, want ErrLeaseLost", err)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.live) != 1 || obs.live[0] {
		t.Fatalf("lease lost reported %d times, context live at each: %v; want once, the context ended", len(obs.live), obs.live)
	}
	if cause := context.Cause(exec.Context()); !errors.Is(cause, idem.ErrLeaseLost) {
		t.Fatalf("cause = %v, want ErrLeaseLost", cause)
	}
}

func TestGuardRenewalFails(t *testing.T) {
	// A store that cannot be reached: the watchdog retries with a backoff
	// (from a thirtieth of the lease, doubling), not in a tight loop, and
	// gives the lease up once it may have ended.
	t.Parallel()
	s := &hookStore{Store: memstore.New(nil), extend: func(context.Context, idem.Lease, time.Duration) (idem.Lease, error) {
		return idem.Lease{}, errors.New("connection refused")
	}}
	const lease = 1500 * time.Millisecond
	g := newGuard(t, s, &idem.GuardConfig{Lease: lease})
	exec := begin(t, g, "k")
	defer exec.Abandon()
	if cause := waitDone(t, exec.Context(), 10*time.Second); !errors.Is(cause, idem.ErrLeaseLost) {
		t.Fatalf("context cause = %v, want ErrLeaseLost", cause)
	}
	// At a third of the lease (500 ms), then 50, 100, 200 and 400 ms
	// later; the lease's end at 1500 ms cuts the rest: 5 attempts, or
	// fewer on a timer hundreds of milliseconds late, never dozens.
	// (Retried only a third later, there were 2.)
	if n := s.extends.Load(); n < 3 || n > 8 {
		t.Fatalf("%d renewal attempts in one lease against a failing store; want 3 to 8", n)
	}
}

// A renewal that times out once (a store slower than a third of the
// lease) is retried at once, within the third of the lease that
// remains: the work runs on through the retry and the renewal after it,
// and its completion is stored. A retry a third later, as after a
// success, came at the lease's end, and the execution lost its key. The
// lease is long: after the renewal that timed out, the retry has a third
// of it to be confirmed in (200 ms of a 600 ms lease were missed on a
// loaded machine).
func TestGuardRetriesTimedOutRenewal(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	ms := memstore.New(nil)
	s := &hookStore{Store: ms}
	s.extend = func(ctx context.Context, l idem.Lease, ttl time.Duration) (idem.Lease, error) {
		if s.extends.Load() == 1 { // hookStore counted this call
			<-ctx.Done() // the first renewal: slower than its deadline
			return idem.Lease{}, ctx.Err()
		}
		return ms.Extend(ctx, l, ttl)
	}
	const lease = 3 * time.Second
	g := newGuard(t, s, &idem.GuardConfig{Lease: lease})
	exec := begin(t, g, "k")
	for deadline := time.Now().Add(30 * time.Second); s.renewed.Load() < 2; time.Sleep(time.Millisecond) {
		if exec.Context().Err() != nil {
			t.Fatalf("work cancelled after one renewal timed out: %v", context.Cause(exec.Context()))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d renewals confirmed, want the retry and the one after it", s.renewed.Load())
		}
	}
	if exec.Context().Err() != nil {
		t.Fatalf("work cancelled after its lease was renewed: %v", context.Cause(exec.Context()))
	}
	if err := exec.Complete(ctx, idem.Response{StatusCode: 201, Body: []byte("done")}); err != nil {
		t.Fatalf("Complete = %v; want the completion stored", err)
	}
	rec, err := ms.Get(ctx, "scope", "k")
	if err != nil || rec.Status != idem.StatusCompleted || rec.Fence != 1 || string(rec.Response.Body) != "done" {
		t.Fatalf("record %+v, %v; want completed by the first execution (fence 1)", rec, err)
	}
	if n := s.extends.Load(); n < 3 {
		t.Fatalf("%d renewals; want the timed-out one, its retry and later ones", n)
	}
}

func TestGuardMaxExecution(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := memstore.New(nil)
	// The lease is long enough that a loaded scheduler does not lose it
	// (ErrLeaseLost) before the maximum execution time is reached: each
	// renewal has 800 ms to be confirmed (150 ms leases left 100 ms).
	const lease, maxExec = 1200 * time.Millisecond, 1500 * time.Millisecond
	g := newGuard(t, s, &idem.GuardConfig{Lease: lease, MaxExecution: maxExec})
	started := time.Now()
	exec := begin(t, g, "k")
	cause := waitDone(t, exec.Context(), 10*time.Second)
	if !errors.Is(cause, idem.ErrMaxExecution) {
		t.Fatalf("context cause = %v, want ErrMaxExecution", cause)
	}
	if d := time.Since(started); d < maxExec {
		t.Errorf("cancelled after %v, before the maximum execution time %v", d, maxExec)
	}
	// The watchdog no longer renews: the lease runs out and a retry takes
	// the key over; the execution's completion is then refused.
	taker, res, err := g.Begin(ctx, "scope", "k", "fp")
	for deadline := time.Now().Add(30 * time.Second); err == nil && res.Outcome == idem.InFlight && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		taker, res, err = g.Begin(ctx, "scope", "k", "fp")
	}
	if err != nil || res.Outcome != idem.Acquired || !res.TookOver || res.Lease.Fence != 2 {
		t.Fatalf("Begin after the maximum execution = %v, took over %v, %v", res.Outcome, res.TookOver, err)
	}
	defer taker.Abandon()
	if err := exec.Complete(ctx, idem.Response{StatusCode: 200}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Complete after a takeover = %v, want ErrLeaseLost", err)
	}
	if err := exec.Complete(ctx, idem.Response{StatusCode: 200}); !errors.Is(err, idem.ErrFinished) {
		t.Fatalf("Complete after ErrLeaseLost = %v, want ErrFinished", err)
	}
}

func TestGuardCompleteTxUnsupported(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := memstore.New(nil)
	if _, ok := any(s).(idem.TxCompleter); ok {
		t.Fatal("memstore implements TxCompleter")
	}
	g := newGuard(t, s, nil)
	exec := begin(t, g, "k")
	if err := exec.CompleteTx(ctx, nil, idem.Response{StatusCode: 200}); !errors.Is(err, idem.ErrTxUnsupported) {
		t.Fatalf("CompleteTx = %v, want ErrTxUnsupported", err)
	}
	// The execution is untouched and still completes.
	if err := exec.Complete(ctx, idem.Response{StatusCode: 200}); err != nil {
		t.Fatalf("Complete after ErrTxUnsupported: %v", err)
	}
}

func TestGuardAbandon(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := memstore.New(nil)
	const lease = 30 * time.Millisecond
	g := newGuard(t, s, &idem.GuardConfig{Lease: lease})
	exec := begin(t, g, "k")
	l := exec.Lease()
	exec.Abandon()
	if cause := waitDone(t, exec.Context(), time.Second); !errors.Is(cause, context.Canceled) {
		t.Errorf("context cause after Abandon = %v, want context.Canceled", cause)
	}
	rec, err := s.Get(ctx, "scope", "k")
	if err != nil || rec.Status != idem.StatusProcessing || rec.Owner != l.Owner || rec.Fence != l.Fence {
		t.Fatalf("record after Abandon = %+v, %v; want processing, held by the abandoned lease", rec, err)
	}
	if err := exec.Complete(ctx, idem.Response{}); !errors.Is(err, idem.ErrFinished) {
		t.Errorf("Complete after Abandon = %v, want ErrFinished", err)
	}
	// Nobody renews the lease: it runs out and a retry takes over.
	time.Sleep(2 * lease)
	taker, res, err := g.Begin(ctx, "scope", "k", "fp")
	if err != nil || !res.TookOver || res.Lease.Fence != 2 {
		t.Fatalf("Begin after the abandoned lease = %v, took over %v, %v", res.Outcome, res.TookOver, err)
	}
	taker.Abandon()
}

func TestGuardParentContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancelCause(t.Context())
	g := newGuard(t, memstore.New(nil), nil)
	exec, _, err := g.Begin(ctx, "scope", "k", "fp")
	if err != nil || exec == nil {
		t.Fatalf("Begin: %v", err)
	}
	errGone := errors.New("client gone")
	cancel(errGone)
	if cause := waitDone(t, exec.Context(), time.Second); !errors.Is(cause, errGone) {
		t.Errorf("context cause = %v, want the parent's", cause)
	}
	// The execution can still release with a live context.
	if err := exec.Release(context.WithoutCancel(ctx)); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func TestGuardCompleteLeaseLostCause(t *testing.T) {
	// A completion refused by the fence ends the execution with cause
	// ErrLeaseLost, so work still running learns why.
	t.Parallel()
	s := &hookStore{Store: memstore.New(nil), complete: func(context.Context, idem.Lease, idem.Response, time.Duration) error {
		return idem.ErrLeaseLost
	}}
	g := newGuard(t, s, nil)
	exec := begin(t, g, "k")
	if err := exec.Complete(t.Context(), idem.Response{StatusCode: 200}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Complete = %v, want ErrLeaseLost", err)
	}
	if cause := context.Cause(exec.Context()); !errors.Is(cause, idem.ErrLeaseLost) {
		t.Fatalf("cause = %v, want ErrLeaseLost", cause)
	}
	if err := exec.Complete(t.Context(), idem.Response{StatusCode: 200}); !errors.Is(err, idem.ErrFinished) {
		t.Fatalf("second Complete = %v, want ErrFinished", err)
	}
}

func TestGuardCommittedWithoutCompleteTx(t *testing.T) {
	// Committed reports false at no cost when CompleteTx was not used, and
	// after a Release or Abandon.
	t.Parallel()
	g := newGuard(t, memstore.New(nil), nil)
	for _, end := range []func(*idem.Execution){
		func(e *idem.Execution) { e.Release(t.Context()) },
		func(e *idem.Execution) { e.Abandon() },
	} {
		exec := begin(t, g, "k-"+idem.NewOwner())
		end(exec)
		if _, ok, err := exec.Committed(t.Context()); ok || err != nil {
			t.Fatalf("Committed after the execution ended = %v, %v; want false, nil", ok, err)
		}
	}
}

func TestGuardStoreTimeout(t *testing.T) {
	// A store that hangs until its context ends: every call the guard makes
	// is bounded by StoreTimeout.
	t.Parallel()
	hang := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	s := &hookStore{Store: memstore.New(nil), complete: func(ctx context.Context, _ idem.Lease, _ idem.Response, _ time.Duration) error {
		return hang(ctx)
	}}
	g := newGuard(t, s, &idem.GuardConfig{StoreTimeout: 50 * time.Millisecond})
	exec := begin(t, g, "k")
	start := time.Now()
	err := exec.Complete(context.Background(), idem.Response{StatusCode: 200})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Complete on a hanging store = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Complete took %v with a 50ms store timeout", d)
	}
	exec.Abandon()

	// A negative StoreTimeout leaves only the caller's context.
	g2 := newGuard(t, s, &idem.GuardConfig{StoreTimeout: -1})
	exec = begin(t, g2, "k2")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := exec.Complete(ctx, idem.Response{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Complete = %v, want the caller's deadline", err)
	}
	exec.Abandon()
}

// A renewal that hangs (a store that swallows packets and ignores its
// context) does not keep the work running past the lease the store last
// confirmed: the context is cancelled with ErrLeaseLost by then, and the
// renewal's late success does not revive the execution.
func TestGuardRenewalHangs(t *testing.T) {
	t.Parallel()
	mem := memstore.New(nil)
	release, returned := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	s := &hookStore{Store: mem}
	s.extend = func(ctx context.Context, l idem.Lease, ttl time.Duration) (idem.Lease, error) {
		if s.extends.Load() > 1 {
			return mem.Extend(ctx, l, ttl)
		}
		defer close(returned)
		<-release // the first renewal ignores its context
		return mem.Extend(context.WithoutCancel(ctx), l, ttl)
	}
	// Long enough that the first renewal (a third in) starts before the
	// lease ends, also when a loaded machine runs the timer late.
	const lease = 900 * time.Millisecond
	g := newGuard(t, s, &idem.GuardConfig{Lease: lease})
	before := time.Now()
	exec := begin(t, g, "k")
	after := time.Now()
	defer exec.Abandon()
	defer unblock() // before Abandon, which may wait for the renewal
	acquired := exec.Lease()

	// The guard counts the lease from just before its Acquire was sent:
	// between before and after. The context is live until before+lease
	// and says the lease is lost from after+lease on, whether or not the
	// watchdog's timer has run (a loaded machine runs it late: Done
	// closes then, Err says so at once).
	ctx := exec.Context()
	for {
		err := ctx.Err()
		now := time.Now()
		if err != nil {
			if now.Before(before.Add(lease)) {
				t.Errorf("context cancelled %v after Begin started, before the lease (%v) could end", now.Sub(before), lease)
			}
			break
		}
		if !now.Before(after.Add(lease)) {
			if ctx.Err() == nil {
				t.Fatalf("context live %v after the lease's end", time.Since(after.Add(lease)))
			}
			break
		}
		time.Sleep(time.Millisecond)
	}
	if cause := waitDone(t, ctx, 5*time.Second); !errors.Is(cause, idem.ErrLeaseLost) {
		t.Fatalf("context cause = %v, want ErrLeaseLost", cause)
	}
	if n := s.extends.Load(); n != 1 {
		t.Fatalf("%d renewals, want the one that hangs", n)
	}

	// The hung renewal now succeeds, late: the watchdog stays over.
	unblock()
	<-returned
	time.Sleep(lease)
	if n := s.extends.Load(); n != 1 {
		t.Errorf("%d renewals after the late success, want none beyond the hung one", n)
	}
	if l := exec.Lease(); !l.Until.Equal(acquired.Until) {
		t.Errorf("Lease().Until moved from %v to %v by a renewal that came back after the lease was lost", acquired.Until, l.Until)
	}
}

// Each renewal's context ends no later than the end of the lease the
// store last confirmed (the guard's estimate counts from before the call
// that confirmed it).
func TestGuardRenewalDeadline(t *testing.T) {
	t.Parallel()
	const lease = 300 * time.Millisecond
	mem := memstore.New(nil)
	var (
		mu         sync.Mutex
		confirmed  time.Time // when the last call that confirmed the lease started
		renewals   int
		violations []string
	)
	errDown := errors.New("connection reset")
	s := &hookStore{Store: mem}
	s.acquire = func(ctx context.Context, req idem.AcquireRequest) (idem.AcquireResult, error) {
		start := time.Now()
		res, err := mem.Acquire(ctx, req)
		if err == nil && res.Outcome == idem.Acquired {
			mu.Lock()
			confirmed = start
			mu.Unlock()
		}
		return res, err
	}
	s.extend = func(ctx context.Context, l idem.Lease, ttl time.Duration) (idem.Lease, error) {
		start := time.Now()
		mu.Lock()
		defer mu.Unlock()
		renewals++
		if d, ok := ctx.Deadline(); !ok || d.After(confirmed.Add(lease)) {
			violations = append(violations, fmt.Sprintf("renewal %d: deadline %v (set %v), %v past the confirmed lease's end",
				renewals, d.Sub(confirmed), ok, d.Sub(confirmed.Add(lease))))
		}
		if renewals > 1 { // the first renewal succeeds, the others fail
			return idem.Lease{}, errDown
		}
		nl, err := mem.Extend(ctx, l, ttl)
		if err == nil {
			confirmed = start
		}
		return nl, err
	}
	g := newGuard(t, s, &idem.GuardConfig{Lease: lease})
	exec := begin(t, g, "k")
	defer exec.Abandon()
	if cause := waitDone(t, exec.Context(), 5*time.Second); !errors.Is(cause, idem.ErrLeaseLost) {
		t.Fatalf("context cause = %v, want ErrLeaseLost", cause)
	}
	mu.Lock()
	defer mu.Unlock()
	if renewals < 3 {
		t.Errorf("%d renewals, want at least 3 (one that succeeds, two that fail)", renewals)
	}
	for _, v := range violations {
		t.Error(v)
	}
}

// A completion that fails with anything but ErrLeaseLost leaves the
// execution open and watched: the watchdog renews the lease again.
func TestGuardFailedCompletionKeepsWatchdog(t *testing.T) {
	t.Parallel()
	errDropped := errors.New("connection dropped")
	for _, tc := range []struct {
		name string
		end  func(ctx context.Context, e *idem.Execution) error
	}{
		{"Complete", func(ctx context.Context, e *idem.Execution) error {
			return e.Complete(ctx, idem.Response{StatusCode: 201})
		}},
		{"CompleteTx", func(ctx context.Context, e *idem.Execution) error {
			return e.CompleteTx(ctx, nil, idem.Response{StatusCode: 201})
		}},
		{"Release", func(ctx context.Context, e *idem.Execution) error { return e.Release(ctx) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			s := newOnceFailing(errDropped)
			const lease = 300 * time.Millisecond
			g := newGuard(t, s, &idem.GuardConfig{Lease: lease})
			exec := begin(t, g, "k")
			defer exec.Abandon()
			if err := tc.end(ctx, exec); !errors.Is(err, errDropped) {
				t.Fatalf("%s = %v, want the store's error", tc.name, err)
			}
			n := s.extends.Load()
			for wait := time.Now().Add(5 * time.Second); s.extends.Load() < n+2 && time.Now().Before(wait); {
				time.Sleep(lease / 6)
			}
			if got := s.extends.Load() - n; got < 2 {
				t.Fatalf("%d renewals after the failed %s, want the watchdog to go on renewing", got, tc.name)
			}
			if err := exec.Context().Err(); err != nil {
				t.Fatalf("context ended (cause %v) while the watchdog renews", context.Cause(exec.Context()))
			}
			rec, err := s.Get(ctx, "scope", "k")
			if l := exec.Lease(); err != nil || rec.Status != idem.StatusProcessing || rec.Owner != l.Owner || !rec.LeaseUntil.After(time.Now()) {
				t.Fatalf("record = %+v, %v; want processing, held by the execution, with a live lease", rec, err)
			}
			// The second attempt goes through.
			if err := tc.end(ctx, exec); err != nil {
				t.Fatalf("second %s: %v", tc.name, err)
			}
		})
	}
}

// onceFailing is a store whose Complete, CompleteTx and Release fail once
// each with a plain error; its CompleteTx then completes at once, as if
// its transaction had committed.
type onceFailing struct {
	*txHookStore
}

func newOnceFailing(err error) *onceFailing {
	mem := memstore.New(nil)
	var complete, completeTx, release atomic.Int64
	s := &onceFailing{&txHookStore{hookStore: &hookStore{Store: mem}}}
	s.complete = func(ctx context.Context, l idem.Lease, resp idem.Response, retention time.Duration) error {
		if complete.Add(1) == 1 {
			return err
		}
		return mem.Complete(ctx, l, resp, retention)
	}
	s.completeTx = func(ctx context.Context, _ *sql.Tx, l idem.Lease, resp idem.Response, retention time.Duration) error {
		if completeTx.Add(1) == 1 {
			return err
		}
		return mem.Complete(ctx, l, resp, retention)
	}
	s.release = func(ctx context.Context, l idem.Lease) error {
		if release.Add(1) == 1 {
			return err
		}
		return mem.Release(ctx, l)
	}
	return s
}

// After a CompleteTx that failed with a plain error, the watchdog cancels
// the context when it loses the lease.
func TestGuardFailedCompleteTxThenLeaseLost(t *testing.T) {
	t.Parallel()
	mem := memstore.New(nil)
	var failed atomic.Bool
	s := &txHookStore{hookStore: &hookStore{Store: mem}}
	s.extend = func(ctx context.Context, l idem.Lease, ttl time.Duration) (idem.Lease, error) {
		if failed.Load() {
			return idem.Lease{}, idem.ErrLeaseLost
		}
		return mem.Extend(ctx, l, ttl)
	}
	errDropped := errors.New("connection dropped")
	s.completeTx = func(context.Context, *sql.Tx, idem.Lease, idem.Response, time.Duration) error {
		failed.Store(true)
		return errDropped
	}
	// A long lease: the store's answer, not the lease's end, cancels the
	// context.
	const lease = 3 * time.Second
	g := newGuard(t, s, &idem.GuardConfig{Lease: lease})
	exec := begin(t, g, "k")
	defer exec.Abandon()
	if err := exec.CompleteTx(t.Context(), nil, idem.Response{StatusCode: 201}); !errors.Is(err, errDropped) {
		t.Fatalf("CompleteTx = %v, want the store's error", err)
	}
	if cause := waitDone(t, exec.Context(), lease); !errors.Is(cause, idem.ErrLeaseLost) {
		t.Fatalf("context cause = %v, want ErrLeaseLost", cause)
	}
	if n := s.extends.Load(); n < 1 {
		t.Errorf("%d renewals after the failed CompleteTx, want at least 1", n)
	}
}

// While the transaction of a successful CompleteTx is open, the watchdog
// neither renews (the record's row is locked by the transaction) nor
// cancels the context (that would roll the transaction back). When the
// transaction rolled back, it resumes: here the lease ran out meanwhile,
// so the context is cancelled with ErrLeaseLost.
func TestGuardCompleteTxHoldsWatchdog(t *testing.T) {
	t.Parallel()
	mem := memstore.New(nil)
	s := &txHookStore{hookStore: &hookStore{Store: mem}}
	s.completeTx = func(context.Context, *sql.Tx, idem.Lease, idem.Response, time.Duration) error {
		return nil // the completion waits in the transaction, which will roll back
	}
	// Long enough that the watchdog keeps the lease until CompleteTx
	// pauses it, also on a loaded machine.
	const lease = 600 * time.Millisecond
	g := newGuard(t, s, &idem.GuardConfig{Lease: lease, MaxExecution: 2 * lease})
	exec := begin(t, g, "k")
	defer exec.Abandon()
	if err := exec.CompleteTx(t.Context(), nil, idem.Response{StatusCode: 201}); err != nil {
		t.Fatalf("CompleteTx: %v", err)
	}
	n := s.extends.Load()
	time.Sleep(2*lease + lease/4) // past the lease and the maximum execution time
	if err := exec.Context().Err(); err != nil {
		t.Fatalf("context ended (cause %v) while the transaction is open", context.Cause(exec.Context()))
	}
	if got := s.extends.Load(); got != n {
		t.Errorf("%d renewals while the transaction is open, want none", got-n)
	}

	if _, ok, err := exec.Committed(t.Context()); ok || err != nil {
		t.Fatalf("Committed = %v, %v; want false (rolled back)", ok, err)
	}
	cause := waitDone(t, exec.Context(), 5*time.Second)
	if !errors.Is(cause, idem.ErrLeaseLost) && !errors.Is(cause, idem.ErrMaxExecution) {
		t.Fatalf("context cause after the rollback = %v, want ErrLeaseLost or ErrMaxExecution", cause)
	}
}

// A store's CompleteTx answering ErrFinished says that this very lease's
// completion already committed (a retry after a lost reply): the execution
// is finished, and Committed reports the stored response.
func TestGuardCompleteTxAlreadyCommitted(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	mem := memstore.New(nil)
	s := &txHookStore{hookStore: &hookStore{Store: mem}}
	stored := idem.Response{StatusCode: 201, Body: []byte("first commit")}
	s.completeTx = func(ctx context.Context, _ *sql.Tx, l idem.Lease, _ idem.Response, retention time.Duration) error {
		if err := mem.Complete(ctx, l, stored, retention); err != nil { // the earlier transaction's commit
			return err
		}
		return fmt.Errorf("fake: record already completed by this lease: %w", idem.ErrFinished)
	}
	g := newGuard(t, s, nil)
	exec := begin(t, g, "k")
	defer exec.Abandon()
	if err := exec.CompleteTx(ctx, nil, idem.Response{StatusCode: 201, Body: []byte("retry")}); !errors.Is(err, idem.ErrFinished) {
		t.Fatalf("CompleteTx = %v, want ErrFinished", err)
	}
	if cause := waitDone(t, exec.Context(), time.Second); !errors.Is(cause, context.Canceled) {
		t.Errorf("context cause = %v, want context.Canceled", cause)
	}
	if err := exec.Complete(ctx, idem.Response{StatusCode: 500}); !errors.Is(err, idem.ErrFinished) {
		t.Errorf("Complete after it = %v, want ErrFinished", err)
	}
	if err := exec.Release(ctx); !errors.Is(err, idem.ErrFinished) {
		t.Errorf("Release after it = %v, want ErrFinished", err)
	}
	resp, ok, err := exec.Committed(ctx)
	if err != nil || !ok || resp.StatusCode != 201 || string(resp.Body) != "first commit" {
		t.Fatalf("Committed = %+v, %v, %v; want the stored response", resp, ok, err)
	}
	rec, err := mem.Get(ctx, "scope", "k")
	if err != nil || rec.Status != idem.StatusCompleted || string(rec.Response.Body) != "first commit" {
		t.Fatalf("record = %+v, %v; want the first completion", rec, err)
	}
}

// TestGuardStoreContextEndsWithCall checks that the context a store call
// gets is done once the call has returned, also when the store asked for
// its Done channel during the call: a goroutine the store left watching it
// (a query's canceller, the one context.WithCancel starts for a foreign
// parent) must end, not wait for ever.
func TestGuardStoreContextEndsWithCall(t *testing.T) {
	t.Parallel()
	watcherDone := make(chan error, 1)
	hs := &hookStore{Store: memstore.New(nil)}
	hs.complete = func(ctx context.Context, l idem.Lease, resp idem.Response, retention time.Duration) error {
		done := ctx.Done() // armed during the call
		go func() {
			<-done
			watcherDone <- ctx.Err()
		}()
		return hs.Store.Complete(ctx, l, resp, retention)
	}
	g := newGuard(t, hs, &idem.GuardConfig{StoreTimeout: time.Hour})
	exec := begin(t, g, "k-"+t.Name())
	if err := exec.Complete(t.Context(), idem.Response{StatusCode: 200}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-watcherDone:
		if err == nil {
			t.Fatal("the store call's context is done but its Err is nil")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the store call's context is still live 10s after the call returned (its bound is an hour)")
	}
}

// TestGuardDoReleaseFails checks that Do leaves nothing running when it
// cannot release the record (work failed or panicked, and the store is
// down): the execution is abandoned, its context ends and the watchdog
// stops renewing, so the record is left to its lease as Do's doc says,
// instead of being renewed until the maximum execution time (5 min by
// default) while no one runs.
func TestGuardDoReleaseFails(t *testing.T) {
	t.Parallel()
	errDown := errors.New("store down")
	errBoom := errors.New("boom")
	for _, panics := range []bool{false, true} {
		t.Run(fmt.Sprint("panics=", panics), func(t *testing.T) {
			t.Parallel()
			s := &hookStore{Store: memstore.New(nil), release: func(context.Context, idem.Lease) error { return errDown }}
			// No renewal is due (a third of the lease) while Do runs, also
			// on a loaded machine: one that began before Do stopped the
			// watchdog would be counted after it.
			const lease = 300 * time.Millisecond
			g := newGuard(t, s, &idem.GuardConfig{Lease: lease})
			var workCtx context.Context
			func() {
				defer func() { _ = recover() }()
				_, _, err := g.Do(t.Context(), "scope", "k", "fp", func(ctx context.Context) (idem.Response, error) {
					workCtx = ctx
					if panics {
						panic("work exploded")
					}
					return idem.Response{}, errBoom
				})
				if !errors.Is(err, errBoom) || !errors.Is(err, errDown) {
					t.Errorf("Do = %v, want the work's and the store's errors", err)
				}
			}()
			if workCtx.Err() == nil {
				t.Fatal("Do returned and the execution's context is still live: its watchdog still renews the lease")
			}
			before := s.extends.Load()
			time.Sleep(lease) // three renewals' worth
			if n := s.extends.Load() - before; n != 0 {
				t.Fatalf("%d renewals after Do returned; the record must be left to its lease", n)
			}
		})
	}
}

// TestGuardContextErrAtLeaseEnd checks that the execution's context says
// the lease may have ended (Err is ErrLeaseLost) as soon as the lease
// last confirmed has ended, also when the watchdog's timer has not run
// yet: a process starved of CPU (here, one P kept busy by the work) runs
// its timers late, and work that checks ctx.Err() before its effect must
// not go on past the lease, when another execution may hold the key.
// It runs itself in a child process with GOMAXPROCS=1.
func TestGuardContextErrAtLeaseEnd(t *testing.T) {
	if os.Getenv("IDEM_TEST_ONE_P") != "1" {
		t.Parallel()
		cmd := exec.Command(os.Args[0], "-test.run=^TestGuardContextErrAtLeaseEnd$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "IDEM_TEST_ONE_P=1", "GOMAXPROCS=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return
	}
	const lease = 5 * time.Millisecond
	hs := &hookStore{Store: memstore.New(nil)}
	hs.extend = func(ctx context.Context, l idem.Lease, ttl time.Duration) (idem.Lease, error) {
		<-ctx.Done() // no renewal is ever confirmed
		return idem.Lease{}, ctx.Err()
	}
	g := newGuard(t, hs, &idem.GuardConfig{Lease: lease})
	exec := begin(t, g, "k")
	began := time.Now() // the lease was counted from before this
	ctx := exec.Context()
	// Keep the only P busy past the lease's end (well under the 10 ms
	// after which the runtime preempts a running goroutine): no timer runs.
	for time.Since(began) < lease+time.Millisecond {
	}
	if err := ctx.Err(); err == nil {
		t.Fatalf("%v after the lease began, with no renewal confirmed, ctx.Err() = nil; want ErrLeaseLost", time.Since(began))
	}
	if cause := context.Cause(ctx); !errors.Is(cause, idem.ErrLeaseLost) {
		t.Fatalf("cause = %v, want ErrLeaseLost", cause)
	}
	exec.Abandon()
}

// TestGuardDoWorkCompletes: work that completes its execution itself
// (FromContext(ctx).Complete) gets what it stored back from Do, with no
// error, and the record keeps that response.
func TestGuardDoWorkCompletes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := memstore.New(nil)
	g := newGuard(t, s, nil)
	stored := idem.Response{StatusCode: 201, Body: []byte("stored by work")}
	resp, replayed, err := g.Do(ctx, "scope", "k", "fp", func(ctx context.Context) (idem.Response, error) {
		if err := idem.FromContext(ctx).Complete(ctx, stored); err != nil {
			return idem.Response{}, err
		}
		return idem.Response{StatusCode: 200, Body: []byte("returned")}, nil
	})
	if err != nil || replayed || string(resp.Body) != "stored by work" || resp.StatusCode != 201 {
		t.Fatalf("Do = %+v, %v, %v; want what work stored, no error", resp, replayed, err)
	}
	rec, err := s.Get(ctx, "scope", "k")
	if err != nil || rec.Status != idem.StatusCompleted || string(rec.Response.Body) != "stored by work" {
		t.Fatalf("record = %+v, %v; want work's completion", rec, err)
	}
}

// A caller that goes away while its Acquire is on the wire (a client that
// hangs up as its request arrives) leaves no record in flight. A driver
// whose statement committed answers the cancellation, not the outcome
// (pgx, go-sql-driver/mysql and modernc's sqlite all do, depending on when
// the cancel lands): before, Begin returned that error with the key
// acquired, nobody could release it, and every retry got 409 PROCESSING
// until the lease ran out. The Acquire now runs to its end, bounded by
// StoreTimeout only, and a key acquired for a caller that has gone is
// released at once.
func TestGuardBeginCallerGoneMidAcquire(t *testing.T) {
	t.Parallel()
	mem := memstore.New(nil)
	ctx, cancel := context.WithCancel(t.Context())
	s := &hookStore{Store: mem, acquire: func(actx context.Context, req idem.AcquireRequest) (idem.AcquireResult, error) {
		res, err := mem.Acquire(actx, req) // the statement committed...
		cancel()                           // ...as the caller went away
		if err := actx.Err(); err != nil {
			return idem.AcquireResult{}, err // the driver reports the cancellation
		}
		return res, err
	}}
	g := newGuard(t, s, nil)
	exec, _, err := g.Begin(ctx, "scope", "k", "fp")
	if err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("Begin for a caller that went away = %v, %v; want context.Canceled", exec, err)
	}
	if rec, err := mem.Get(t.Context(), "scope", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("record after a cancelled Begin: %+v, %v; want none (a retry must run at once)", rec, err)
	}
	// A retry runs at once.
	exec = begin(t, newGuard(t, mem, nil), "k")
	exec.Abandon()

	// A caller gone before Begin does not reach the store.
	s.acquire = func(context.Context, idem.AcquireRequest) (idem.AcquireResult, error) {
		t.Error("Acquire called for a caller that had gone")
		return idem.AcquireResult{}, errors.New("unexpected")
	}
	if _, _, err := g.Begin(ctx, "scope", "k2", "fp"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Begin with a cancelled context = %v, want context.Canceled", err)
	}
}
