package lock

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/retry"
)

// Lease is a held lock: its name, owner token and fence, and a watchdog
// that renews it every third of the TTL until Release, the maximum hold,
// or its loss. The Leases of a Locker are safe for concurrent use.
//
// A Lease's end is estimated on the local clock, conservatively: from just
// before the call that confirmed it was sent, so the holder believes it
// holds the lock for less time than the backend grants (up to the drift
// between the clocks over one TTL). Done closes, and the contexts of
// Context are cancelled, at that estimated end unless a renewal was
// confirmed before it, whether or not the renewal is still waiting for
// its answer.
//
// Lease is an interface so that code holding one can be tested with a
// fake (a lease whose Context never ends, a fence of the test's choice);
// only Locker makes real ones. The methods' contracts are those of the
// Locker's leases, documented on each.
type Lease interface {
	// Name returns the lock's name.
	Name() string
	// Owner returns the lease's owner token (128 random bits, hex).
	Owner() string
	// Fence returns the lease's fencing token: greater than that of
	// every earlier lease of the name. Present it to the resource the
	// lock protects, which must refuse a write with a fence lower than
	// one it has seen (UPDATE … WHERE last_fence < fence).
	Fence() int64
	// Done returns a channel closed when the lease ends: lost, run out
	// at the maximum hold, or released. Err then says which.
	Done() <-chan struct{}
	// Err returns nil while the lease is held, and once it ended
	// ErrLost, ErrMaxHold or ErrReleased.
	Err() error
	// Context returns a context derived from parent that is also
	// cancelled when the lease ends, with its Err as the cause. Call the
	// CancelFunc when done with it.
	Context(parent context.Context) (context.Context, context.CancelFunc)
	// Release ends the lease and frees the lock; ErrNotHeld when the
	// backend no longer held it for this lease.
	Release(ctx context.Context) error
}

var _ Lease = (*heldLease)(nil)

// heldLease is the Lease a Locker hands out, with its watchdog.
type heldLease struct {
	lk          *Locker
	name, owner string
	fence       int64

	ctx    context.Context // cancelled, with Err as cause, when the lease ends
	cancel context.CancelCauseFunc

	// The watchdog: one timer, and no goroutine between its runs. When
	// the timer fires (tick) with no renewal running, the renewal runs in
	// the timer's goroutine, and the timer is set to the end of the lease
	// last confirmed: if it fires then while the renewal still waits for
	// its answer, the lease ends with ErrLost.
	mu          sync.Mutex
	timer       *time.Timer
	wakeAt      time.Time          // when the timer was last set to fire
	over        bool               // the watchdog has ended for good
	final       bool               // the maximum hold allows no more renewal
	released    bool               // Release was called
	renewing    bool               // a renewal of the current epoch waits for its answer
	retryIn     time.Duration      // the wait after the last renewal, if it failed; 0 after a success
	epoch       uint64             // counts halts: a renewal started before the last one is stale
	renewCancel context.CancelFunc // cancels the running renewal, if any
	validUntil  time.Time          // local, conservative estimate of the confirmed lease's end
	maxUntil    time.Time          // end of the maximum hold; zero if none
	// base is when the Acquire was sent; due is how long after base the
	// lease ends while the watchdog runs, math.MaxInt64 once it does not;
	// wallDue is that end on the wall clock (validUntil's wall reading,
	// Unix nanoseconds; the wall clock may have been stepped since base).
	// Err reads them without mu.
	base    time.Time
	due     atomic.Int64
	wallDue atomic.Int64
}

// start returns the running lease of an Acquire sent at sent.
func (l *Locker) start(name, owner string, fence int64, sent time.Time) *heldLease {
	ctx, cancel := context.WithCancelCause(context.Background())
	e := &heldLease{lk: l, name: name, owner: owner, fence: fence, ctx: ctx, cancel: cancel, base: sent}
	e.validUntil = sent.Add(l.cfg.TTL)
	if l.cfg.MaxHold > 0 {
		e.maxUntil = sent.Add(l.cfg.MaxHold)
	}
	e.mu.Lock()
	now := time.Now()
	d := e.nextWake(now)
	e.wakeAt = now.Add(d)
	e.setDue()
	e.timer = time.AfterFunc(d, e.tick)
	e.mu.Unlock()
	return e
}

// Name returns the lock's name.
func (e *heldLease) Name() string { return e.name }

// Owner returns the lease's owner token (128 random bits, hex).
func (e *heldLease) Owner() string { return e.owner }

// Fence returns the lease's fencing token: greater than that of every
// earlier lease of the name. Present it to the resource the lock
// protects, which must refuse a write with a fence lower than one it has
// seen (UPDATE … WHERE last_fence < fence).
func (e *heldLease) Fence() int64 { return e.fence }

// Done returns a channel closed when the lease ends: lost, run out at the
// maximum hold, or released. Err then says which.
func (e *heldLease) Done() <-chan struct{} { return e.ctx.Done() }

// Err returns nil while the lease is held, and after Done closed
// ErrLost, ErrMaxHold or ErrReleased. It checks the clock: past the end
// of the lease last confirmed it ends the lease itself, should the
// watchdog's timer not have run yet (a process starved of CPU runs its
// timers late; a machine woken from a suspend runs them once its
// monotonic clock, which stood still, has caught up), so work that checks
// Err before its effect never goes on past the lease. The time passed is
// the larger of the monotonic and the wall clock's.
func (e *heldLease) Err() error {
	if e.ctx.Err() == nil {
		due := time.Duration(e.due.Load())
		if time.Since(e.base) < due && wallNow().UnixNano() < e.wallDue.Load() {
			return nil
		}
		e.expire()
		if e.ctx.Err() == nil {
			return nil
		}
	}
	return context.Cause(e.ctx)
}

// Context returns a context derived from parent that is also cancelled
// when the lease ends, with its Err (ErrLost, ErrMaxHold, ErrReleased) as
// the cause (context.Cause). Its Err checks the clock as the lease's Err
// does. Call the CancelFunc when done with it.
func (e *heldLease) Context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	stop := context.AfterFunc(e.ctx, func() { cancel(context.Cause(e.ctx)) })
	c := &leaseContext{Context: ctx, lease: e, cancel: cancel}
	return c, func() {
		stop()
		cancel(context.Canceled)
	}
}

// leaseContext is a context of Context: its Err ends it at once when the
// lease has ended (AfterFunc's goroutine may not have run yet).
type leaseContext struct {
	context.Context
	lease  *heldLease
	cancel context.CancelCauseFunc
}

func (c *leaseContext) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	if cause := c.lease.Err(); cause != nil {
		c.cancel(cause)
	}
	return c.Context.Err()
}

// Release ends the lease: its contexts are cancelled with ErrReleased
// (unless it had ended before) and the backend frees the lock, keeping
// its fence. ErrNotHeld means the backend no longer held it for this
// lease (it had been lost or had run out), or Release was called before.
// Any other error means the backend did not answer: the lock is left to
// run out at the end of its lease. A renewal in flight is cancelled, not
// waited for.
func (e *heldLease) Release(ctx context.Context) error {
	e.mu.Lock()
	if e.released {
		e.mu.Unlock()
		return ErrNotHeld
	}
	e.released = true
	e.endWatch(ErrReleased)
	e.mu.Unlock()
	obs := e.lk.cfg.Observer
	if obs == nil {
		return e.lk.b.Release(ctx, e.name, e.owner, e.fence)
	}
	ev := e.lk.event(idem.OpRelease, e.name)
	if c := obs.Start(ctx, ev); c != nil {
		ctx = c
	}
	start := time.Now()
	err := e.lk.b.Release(ctx, e.name, e.owner, e.fence)
	ev.Duration, ev.Err, ev.Outcome = time.Since(start), err, idem.OutcomeReleased
	if err != nil {
		ev.Outcome = idem.OutcomeError
	}
	obs.End(ctx, ev)
	return err
}

// nextWake is how long the watchdog sleeps: a third of the TTL, or less
// to meet the end of the lease. mu held.
func (e *heldLease) nextWake(now time.Time) time.Duration {
	return max(min(e.lk.cfg.TTL/3, e.validUntil.Sub(now)), 0)
}

// wake sets the timer to fire after d. mu held.
func (e *heldLease) wake(now time.Time, d time.Duration) {
	e.wakeAt = now.Add(d)
	e.setDue()
	e.timer.Reset(d)
}

// setDue publishes when the lease ends, for Err. mu held.
func (e *heldLease) setDue() {
	if e.over {
		e.due.Store(math.MaxInt64)
		e.wallDue.Store(math.MaxInt64)
		return
	}
	e.due.Store(int64(e.validUntil.Sub(e.base)))
	e.wallDue.Store(e.validUntil.UnixNano())
}

// endCause is the error the lease ends with when it runs out: ErrMaxHold
// if the lease last confirmed reached the maximum hold, as far as a
// renewal could take it (to within a millisecond), whether or not a run
// of the watchdog found it so before the end (its timer may run late).
// mu held.
func (e *heldLease) endCause() error {
	if e.final || !e.maxUntil.IsZero() && e.maxUntil.Sub(e.validUntil) < time.Millisecond {
		return ErrMaxHold
	}
	return ErrLost
}

// endWatch ends the watchdog for good, and the lease with cause: it
// cancels the lease's context with cause, stops the timer and cancels the
// running renewal, if any, whose outcome will be ignored. mu held. The
// context is cancelled here, under mu, not after: Err answers from the
// context once the watchdog is over, and must never find it over and the
// context still live.
func (e *heldLease) endWatch(cause error) {
	e.cancel(cause)
	e.over = true
	e.epoch++
	e.setDue()
	e.timer.Stop()
	e.renewing = false
	if e.renewCancel != nil {
		e.renewCancel()
		e.renewCancel = nil
	}
}

// expire ends the lease if the lease last confirmed has ended while the
// watchdog runs (what tick does when its timer fires then).
func (e *heldLease) expire() {
	e.mu.Lock()
	if e.over || !e.ended(time.Now()) {
		e.mu.Unlock()
		return
	}
	cause := e.endCause()
	e.endWatch(cause)
	e.mu.Unlock()
	e.report(cause, nil)
}

// tick runs in the timer's goroutine. Once the lease last confirmed has
// ended, it ends the lease, whether or not a renewal still waits for its
// answer. Otherwise, unless a renewal is running (its answer sets the
// timer again), it renews the lease for the TTL, or for what remains of
// the maximum hold: the Extend is bounded by a third of the TTL and by
// the end of the lease last confirmed, and the timer is set to that end
// meanwhile. The renewal's answer schedules the next one, or ends the
// lease when the backend refuses it or the answer came after the lease
// had ended. When the maximum hold allows no renewal that would extend
// the lease, the timer is set to its end.
func (e *heldLease) tick() {
	cfg := &e.lk.cfg
	e.mu.Lock()
	if e.over {
		e.mu.Unlock()
		return
	}
	now := time.Now()
	if e.ended(now) {
		cause := e.endCause()
		e.endWatch(cause)
		e.mu.Unlock()
		e.report(cause, nil)
		return
	}
	if e.renewing || e.final || now.Before(e.wakeAt) {
		// A renewal waits for its answer, which sets the timer again; the
		// timer waits for the end of the maximum hold; or this is a run of
		// the timer set before it was last reset.
		e.mu.Unlock()
		return
	}
	ttl := cfg.TTL
	if !e.maxUntil.IsZero() {
		// What remains of the hold on either clock, as in ended (the
		// backend's clock went on through a suspend), in whole
		// milliseconds: what every backend's clock can count.
		left := min(e.maxUntil.Sub(now), e.maxUntil.Round(0).Sub(wallNow()))
		ttl = min(ttl, left.Truncate(time.Millisecond))
	}
	if ttl <= 0 || !now.Add(ttl).After(e.validUntil) {
		e.final = true
		e.wake(now, e.validUntil.Sub(now))
		e.mu.Unlock()
		return
	}
	epoch := e.epoch
	deadline := now.Add(cfg.TTL / 3)
	if e.validUntil.Before(deadline) {
		deadline = e.validUntil
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	e.renewing, e.renewCancel = true, cancel
	e.wake(now, e.validUntil.Sub(now))
	e.mu.Unlock()

	sent := time.Now()
	err := e.lk.b.Extend(ctx, e.name, e.owner, e.fence, ttl)
	cancel()

	e.mu.Lock()
	if epoch != e.epoch { // ended while the renewal ran: its outcome is stale
		e.mu.Unlock()
		return
	}
	e.renewing, e.renewCancel = false, nil
	now = time.Now()
	var cause error
	switch {
	case errors.Is(err, ErrNotHeld):
		cause = ErrLost
	case e.ended(now):
		cause = e.endCause()
	case err == nil:
		e.validUntil = sent.Add(ttl)
		// A renewal the maximum hold shortened is the last: it took the
		// lease to within a millisecond of the maximum hold, and one more
		// would add microseconds. Without this the timer would find the
		// lease ended before any tick had found the hold used up, and end
		// it with ErrLost.
		e.final = ttl < cfg.TTL
	}
	switch {
	case cause != nil:
		e.endWatch(cause)
	case e.final:
		e.wake(now, e.validUntil.Sub(now))
	case err != nil:
		e.retryIn = retry.After(e.retryIn, e.lk.cfg.TTL)
		e.wake(now, min(e.retryIn, e.nextWake(now)))
	default:
		e.retryIn = 0
		e.wake(now, e.nextWake(now))
	}
	e.mu.Unlock()
	e.report(cause, err)
}

// report logs what the watchdog found (err: a renewal's error), and ends
// the lease with cause if it is set.
func (e *heldLease) report(cause, err error) {
	log := e.lk.cfg.Logger
	ctx := context.Background()
	switch {
	case errors.Is(err, ErrNotHeld):
		log.WarnContext(ctx, "lock: lease lost: renewal refused", idem.LogKey("lock", e.name, false), slog.Int64(idem.LogFence, e.fence))
	case err != nil:
		log.WarnContext(ctx, "lock: lease renewal failed", idem.LogKey("lock", e.name, false), slog.Int64(idem.LogFence, e.fence), slog.Any(idem.LogErr, err))
	}
	if errors.Is(cause, ErrLost) && !errors.Is(err, ErrNotHeld) {
		log.WarnContext(ctx, "lock: lease may have ended: no renewal confirmed it in time", idem.LogKey("lock", e.name, false), slog.Int64(idem.LogFence, e.fence))
	}
	if cause != nil {
		e.cancel(cause)
		if obs := e.lk.cfg.Observer; obs != nil {
			ev := e.lk.event(idem.OpExtend, e.name)
			ev.Outcome, ev.Err = idem.OutcomeLost, cause
			obs.End(ctx, ev)
		}
	}
}

// ended reports whether the lease last confirmed has ended at now, on
// either clock: the monotonic one, which the wall clock's steps do not
// move, or the wall clock, which goes on while the machine is suspended
// and the monotonic clock (Linux's CLOCK_MONOTONIC) stands still, as the
// backend's clock goes on. A step of the wall clock forward ends the
// lease early, never late. mu held.
func (e *heldLease) ended(now time.Time) bool {
	return !now.Before(e.validUntil) || !wallNow().Before(e.validUntil.Round(0))
}

// wallNow is the wall clock's now, without a monotonic reading, moved
// ahead by wallSkew.
func wallNow() time.Time { return time.Now().Round(0).Add(time.Duration(wallSkew.Load())) }

// wallSkew is zero but in the tests, which move the wall clock (in
// nanoseconds) while a watchdog runs.
var wallSkew atomic.Int64
