package idem

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/internal/keyhash"
	"github.com/idemkit/idem/internal/retry"
)

// Defaults of GuardConfig.
const (
	DefaultLease        = 30 * time.Second
	DefaultMaxExecution = 5 * time.Minute
	DefaultRetention    = 24 * time.Hour
	DefaultStoreTimeout = 5 * time.Second
	// DefaultCompleteRetry is GuardConfig.CompleteRetry's default.
	DefaultCompleteRetry = 10 * time.Second
)

// GuardConfig configures a Guard. The zero value of each field means its
// default.
type GuardConfig struct {
	// Lease is how long an execution holds its key without renewal; the
	// watchdog renews it every third of it, and retries a renewal that
	// failed or timed out (each attempt is bounded by a third) soon after,
	// within what remains of the lease. Default 30 s; at least 3 ms.
	Lease time.Duration
	// MaxExecution caps how long the watchdog renews the lease; then the
	// execution's context is cancelled with cause ErrMaxExecution and the
	// lease is left to run out. Default 5 min.
	MaxExecution time.Duration
	// Retention is how long a completed record is replayed, and how long an
	// abandoned processing record is kept after its lease ends. Default 24 h.
	Retention time.Duration
	// StoreTimeout bounds each store call the guard makes: the Acquire of
	// Begin, and the Complete, Release and Get (of Committed) that end an
	// execution; a call that runs out fails with context.DeadlineExceeded,
	// like any store failure. The Acquire runs under StoreTimeout alone,
	// not the caller's context (see Begin). (A renewal is bounded by a third of the lease
	// and by the end of the lease last confirmed; CompleteTx runs under the
	// caller's context and transaction.) Default 5 s; negative means no
	// bound beyond the caller's context.
	StoreTimeout time.Duration
	// CompleteRetry is how long the adapters (Do, idemhttp, idemgrpc)
	// keep trying to store a response after its completion failed on a
	// store error (see Execution.CompleteRetrying): a response the client
	// got but the store did not keep lets a retry run the work again once
	// the lease has run out, so a store that fails for a moment (a
	// failover, a dropped connection) is waited for. Default 10 s;
	// negative means one attempt.
	CompleteRetry time.Duration
	// Logger receives the watchdog's warnings. Nil discards them.
	Logger *slog.Logger
	// Prepare, when set, turns every response an execution stores into the
	// response that is kept: Complete and CompleteTx store what it returns,
	// and Committed reports that. idemhttp uses it to keep only replayable
	// headers and to omit bodies over its limit, on every path. It must not
	// modify resp's header map or body in place. Nil keeps responses as
	// given.
	Prepare func(resp Response) Response
	// Observer, when set, receives a KindStore event for every call the
	// guard makes to its store (NewGuard wraps the store with
	// ObserveStore, under StoreName) and a KindLease event for each
	// renewal of a lease (OutcomeRenewed, OutcomeRenewFailed) and each
	// lease lost (OutcomeLost: the store said so, or no renewal confirmed
	// the lease in time). Nil reports nothing, at the cost of one
	// comparison per renewal.
	Observer Observer
	// StoreName is the Store of the events reported to Observer: "memory",
	// "sqlite", "postgres", "mysql", "redis", "tiered", or what suits a
	// custom store. Empty means DefaultStoreName.
	StoreName string
	// LogKeys lets the guard's log lines carry a record's scope and key
	// (attributes idem.scope and idem.key) beside its hash
	// (idem.key_hash). False, the default, logs the hash alone: keys and
	// scopes may identify users or carry secrets.
	LogKeys bool
}

// Guard runs executions against a Store: acquire, renew the lease while the
// work runs, then complete with the fence or release. A Guard is safe for
// concurrent use.
type Guard struct {
	store Store
	cfg   GuardConfig
	// obs is store when it is observed: the guard calls it with the hash
	// of the execution's key, computed once (see Execution.kh).
	obs *observedStore
}

// NewGuard returns a Guard over s. A nil cfg means defaults; cfg is copied.
func NewGuard(s Store, cfg *GuardConfig) (*Guard, error) {
	if s == nil {
		return nil, errors.New("idem: NewGuard needs a store")
	}
	var c GuardConfig
	if cfg != nil {
		c = *cfg
	}
	switch {
	case c.Lease < 0, c.MaxExecution < 0, c.Retention < 0: // a negative StoreTimeout means none
		return nil, fmt.Errorf("idem: negative duration in GuardConfig (lease %v, max execution %v, retention %v)", c.Lease, c.MaxExecution, c.Retention)
	case c.Lease > 0 && c.Lease < 3*time.Millisecond:
		return nil, fmt.Errorf("idem: lease %v is shorter than 3ms", c.Lease)
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.MaxExecution == 0 {
		c.MaxExecution = DefaultMaxExecution
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = DefaultStoreTimeout
	}
	if c.CompleteRetry == 0 {
		c.CompleteRetry = DefaultCompleteRetry
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.StoreName == "" {
		c.StoreName = DefaultStoreName
	}
	if c.Observer != nil {
		if _, observed := ObservedStore(s); !observed {
			s = ObserveStore(s, c.StoreName, c.Observer)
		}
	}
	return &Guard{store: s, cfg: c, obs: observedOf(s)}, nil
}

// prepare applies the configured Prepare to resp.
func (g *Guard) prepare(resp Response) Response {
	if g.cfg.Prepare == nil {
		return resp
	}
	return g.cfg.Prepare(resp)
}

// Store returns the guard's store (wrapped by ObserveStore when
// GuardConfig.Observer is set).
func (g *Guard) Store() Store { return g.store }

// Config returns the guard's configuration with defaults filled in.
func (g *Guard) Config() GuardConfig { return g.cfg }

// Begin acquires (scope, key). When the outcome is Acquired it returns a
// running Execution whose watchdog renews the lease; the caller must end it
// with Complete, CompleteTx, Release or Abandon. For the other outcomes the
// Execution is nil and the result holds the record found.
//
// A ctx that has ended fails Begin with its error before the store is
// asked. The Acquire itself is not cut short when ctx ends (cancelled or
// past its deadline): StoreTimeout bounds it (with a negative
// StoreTimeout it runs under ctx, and a ctx that ends mid-call may leave
// the key acquired, to its lease). When ctx ends while it runs and the key
// was acquired, the record is released at once and Begin returns ctx's
// error, so a caller that went away leaves no record in flight.
func (g *Guard) Begin(ctx context.Context, scope, key string, fp Fingerprint) (*Execution, AcquireResult, error) {
	req := AcquireRequest{Scope: scope, Key: key, Fingerprint: fp, Lease: g.cfg.Lease, Retention: g.cfg.Retention}
	if err := req.Validate(); err != nil {
		return nil, AcquireResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return nil, AcquireResult{}, err // the caller has gone: the store is not asked
	}
	// The execution is made first: its bounded context serves the Acquire.
	// The Acquire runs to its end even if ctx is cancelled meanwhile (it is
	// bounded by StoreTimeout): a driver cancelled mid-statement reports
	// the cancellation whether or not the statement committed, and a key
	// acquired with nobody told would be left in flight to its lease.
	actx := ctx
	if g.cfg.StoreTimeout >= 0 {
		actx = context.WithoutCancel(ctx)
	}
	e := &Execution{g: g, fp: fp}
	var res AcquireResult
	var err error
	sent := time.Now() // the lease is counted from no later than this
	if g.obs != nil {
		// The key's hash, for the events of the execution's store calls
		// and lease: the caller's (an observed idemhttp or idemgrpc
		// request computed it for its own event), else computed here once.
		if e.kh = keyhash.From(ctx, scope, key); e.kh == nil {
			e.kh = &keyhash.Value{Scope: scope, Key: key, Hash: HashKey(scope, key)}
		}
		res, err = g.obs.acquire(e.bound(actx), req, e.kh.Hash)
	} else {
		res, err = g.store.Acquire(e.bound(actx), req)
	}
	e.unbound()
	if err != nil || res.Outcome != Acquired {
		return nil, res, err
	}
	if err := ctx.Err(); err != nil {
		// The caller went away while the key was being acquired: nobody
		// will run the work or end the execution, so the key is released
		// at once and a retry runs without waiting for the lease.
		if rerr := e.release(e.bound(context.WithoutCancel(ctx)), res.Lease); rerr != nil && !errors.Is(rerr, ErrLeaseLost) {
			g.cfg.Logger.WarnContext(ctx, "idem: cannot release a key acquired for a caller that went away; left to its lease",
				LogKey(scope, key, g.cfg.LogKeys), slog.Any(LogErr, rerr))
		}
		e.unbound()
		return nil, AcquireResult{}, err
	}
	g.start(e, ctx, res.Lease, sent)
	return e, res, nil
}

// Do runs work once for (scope, key). The first call runs work and stores
// its response; later calls with the same fingerprint get the stored
// response and replayed = true without running work. A call while another
// runs gets ErrInFlight; one with another fingerprint gets ErrMismatch.
//
// If work returns an error or panics, the record is released so that a
// retry runs work again (if the store cannot release it, it is left to
// its lease). If work succeeds but the completion cannot be
// stored, Do returns work's response together with the error: the effect
// happened, and the record is left to its lease.
//
// Work may complete inside its own SQL transaction with
// FromContext(ctx).CompleteTx; Do then returns what was committed.
func (g *Guard) Do(ctx context.Context, scope, key string, fp Fingerprint, work func(ctx context.Context) (Response, error)) (resp Response, replayed bool, err error) {
	exec, res, err := g.Begin(ctx, scope, key, fp)
	if err != nil {
		return Response{}, false, err
	}
	switch res.Outcome {
	case Acquired:
	case Completed:
		if res.Record.Response != nil {
			return *res.Record.Response, true, nil
		}
		return Response{}, true, nil
	case InFlight:
		return Response{}, false, ErrInFlight
	case Mismatch:
		return Response{}, false, ErrMismatch
	default:
		return Response{}, false, fmt.Errorf("idem: store returned unknown outcome %v", res.Outcome)
	}

	bg := context.WithoutCancel(ctx)
	finished := false
	defer func() {
		if !finished {
			// Work panicked: let a retry run, or, if the store cannot
			// release, leave the record to its lease.
			if exec.Release(bg) != nil {
				exec.Abandon()
			}
		}
	}()
	resp, err = work(exec.Context())
	if err != nil {
		finished = true
		if stored, ok, cerr := exec.Committed(bg); cerr == nil && ok {
			// The completion committed although work reported an error.
			return stored, false, err
		}
		if rerr := exec.Release(bg); rerr != nil && !errors.Is(rerr, ErrLeaseLost) {
			exec.Abandon() // the record is left to its lease
			return Response{}, false, errors.Join(err, rerr)
		}
		return Response{}, false, err
	}
	finished = true
	if stored, ok, cerr := exec.Committed(bg); cerr != nil {
		exec.Abandon()
		return resp, false, cerr
	} else if ok {
		return stored, false, nil
	}
	if cerr := exec.CompleteRetrying(bg, resp); cerr != nil {
		exec.Abandon()
		return resp, false, fmt.Errorf("idem: work done but completion not stored: %w", cerr)
	}
	return resp, false, nil
}

// NewOwner returns a random owner token (128 bits, hex). Stores use it for
// the owner of a new lease.
func NewOwner() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

type ctxKey struct{}

// FromContext returns the execution whose context ctx is (or derives
// from), or nil.
func FromContext(ctx context.Context) *Execution {
	e, _ := ctx.Value(ctxKey{}).(*Execution)
	return e
}

// execContext is an execution's context: its cancellation, plus the
// execution as the value of ctxKey. It lives inside the Execution, so it
// costs no allocation of its own.
type execContext struct {
	context.Context
	e *Execution
}

// Err is the context's error. Past the end of the lease last confirmed
// (or of the maximum execution time) while the watchdog runs, it ends the
// watchdog and cancels the context itself, should the timer not have run
// yet (a process starved of CPU runs its timers late): work that checks
// Err before its effect never goes on past the lease.
func (c *execContext) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	if e := c.e; time.Since(e.base) >= time.Duration(e.due.Load()) {
		e.expire()
	}
	return c.Context.Err()
}

func (c *execContext) Value(key any) any {
	if key == (ctxKey{}) {
		return c.e
	}
	return c.Context.Value(key)
}

// keyHash returns HashKey of l's scope and key, computed once.
func (e *Execution) keyHash(l Lease) string {
	if e.kh != nil {
		return e.kh.Hash
	}
	return HashKey(l.Scope, l.Key)
}

// release releases l in the store.
func (e *Execution) release(ctx context.Context, l Lease) error {
	if o := e.g.obs; o != nil {
		return o.release(ctx, l, e.kh.Hash)
	}
	return e.g.store.Release(ctx, l)
}

// Execution is one run of work under a lease. Its methods are safe for
// concurrent use.
type Execution struct {
	g      *Guard
	ctx    execContext
	cancel context.CancelCauseFunc
	kh     *keyhash.Value // the key's hash, when the store is observed
	fp     Fingerprint    // the request's, as acquired

	mu       sync.Mutex
	lease    Lease
	finished bool
	// pending is the response a CompleteTx handed to the store (or that a
	// store's ErrFinished says was committed); Committed confirms it.
	pending *Response
	kept    Response // what pending points to after Complete or CompleteTx
	// committed reports that Committed confirmed pending in the store.
	committed bool

	// The watchdog: one timer, and no goroutine between its runs. When the
	// timer fires (tick) with no renewal running, the renewal runs in the
	// timer's goroutine, and the timer is set to the end of the lease last
	// confirmed (or of the maximum execution time): if it fires then while
	// the renewal still waits for its answer, the context is cancelled.
	// The watchdog runs while watchOver is false, no completion call is in
	// flight (completing) and no transaction of a successful CompleteTx is
	// open (txOpen).
	timer       *time.Timer
	wakeAt      time.Time          // when the timer was last set to fire
	watchOver   bool               // ended for good: lease lost, maximum execution time, execution ended
	completing  int                // completion calls in flight
	txOpen      bool               // a CompleteTx succeeded and Committed has not reported on its transaction
	renewing    bool               // a renewal of the current epoch waits for its answer
	retryIn     time.Duration      // the wait after the last renewal, if it failed; 0 after a success
	lostShown   bool               // the lease lost was reported to the Observer
	unsure      bool               // a completion call failed with a store error: it may have committed
	epoch       uint64             // counts halts: a renewal started before the last one is stale
	renewCancel context.CancelFunc // cancels the running renewal, if any
	validUntil  time.Time          // local, conservative estimate of the confirmed lease's end
	maxUntil    time.Time          // end of the maximum execution time
	// base is when the Acquire was sent; due is how long after base the
	// context must end while the watchdog runs (the earlier of validUntil
	// and maxUntil), math.MaxInt64 while it does not. Err reads it
	// without e.mu.
	base time.Time
	due  atomic.Int64

	// callMu serialises the store calls made under a bound (bound,
	// unbound); call is the current one's.
	callMu sync.Mutex
	calls  int
	call   *boundedContext
	bounds [2]boundedContext
}

func (g *Guard) start(e *Execution, parent context.Context, l Lease, acquireSent time.Time) {
	e.lease = l
	// The store counted the lease from no earlier than when the request
	// was sent.
	e.base = acquireSent
	e.validUntil = acquireSent.Add(g.cfg.Lease)
	e.maxUntil = acquireSent.Add(g.cfg.MaxExecution)
	cctx, cancel := context.WithCancelCause(parent)
	e.ctx = execContext{Context: cctx, e: e}
	e.cancel = cancel
	e.mu.Lock()
	now := time.Now()
	d := e.nextWake(now)
	e.wakeAt = now.Add(d)
	e.setDue()
	e.timer = time.AfterFunc(d, e.tick)
	e.mu.Unlock()
}

// bound returns ctx bounded by the guard's StoreTimeout, for one store
// call; unbound must follow the call. Calls are serialised. The first two
// bounds (the Acquire, and the call that ends the execution) live in the
// Execution; any further one is allocated.
func (e *Execution) bound(ctx context.Context) context.Context {
	e.callMu.Lock()
	if e.g.cfg.StoreTimeout < 0 {
		e.call = nil
		return ctx
	}
	switch e.calls++; e.calls {
	case 1:
		e.call = &e.bounds[0]
	case 2:
		e.call = &e.bounds[1]
	default:
		e.call = new(boundedContext)
	}
	e.call.init(ctx, e.g.cfg.StoreTimeout)
	return e.call
}

func (e *Execution) unbound() {
	if e.call != nil {
		e.call.release()
	}
	e.callMu.Unlock()
}

// Context is the work's context. It is cancelled:
//   - with cause ErrLeaseLost when the store answers a renewal with
//     ErrLeaseLost, and at the latest when the lease the store last
//     confirmed may have ended, whether or not a renewal is still waiting
//     for its answer. The guard estimates that end on its own clock,
//     counting the lease from just before it sent the call that confirmed
//     it, so the context ends no later than the store's lease (up to the
//     clocks' drift over one lease). A renewal that answers after that
//     does not revive the execution. The watchdog's timer cancels it; if
//     the timer runs late (a process starved of CPU), Err cancels it when
//     called after that end, so work that checks Err before its effect
//     never goes on past the lease. (Done closes when the timer runs.)
//   - with cause ErrMaxExecution after the maximum execution time;
//   - with context.Canceled when the execution ends.
//
// The watchdog keeps renewing the lease when only the parent context is
// cancelled (a client that went away): the lease lasts until the
// execution ends. It pauses, neither renewing nor cancelling, while
// Complete, CompleteTx or Release runs, and while the transaction of a
// successful CompleteTx is open; a completion that fails with an error
// other than ErrLeaseLost resumes it, and so does Committed when the
// transaction did not commit. If the lease or the maximum execution time
// ended during the pause, the context is cancelled as it resumes.
func (e *Execution) Context() context.Context { return &e.ctx }

// Lease returns the current lease (Until moves as the watchdog renews it).
func (e *Execution) Lease() Lease {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lease
}

// Fingerprint is the fingerprint the execution's record was acquired
// with: a later Acquire of the key must present it (package steps keeps
// it, so that its completer can take an abandoned operation up).
func (e *Execution) Fingerprint() Fingerprint { return e.fp }

// Retention is the retention the execution completes with.
func (e *Execution) Retention() time.Duration { return e.g.cfg.Retention }

// running reports whether the watchdog runs. e.mu held.
func (e *Execution) running() bool { return !e.watchOver && e.completing == 0 && !e.txOpen }

// nextWake is how long the watchdog sleeps: a third of the lease, or less
// to meet the end of the maximum execution time or of the lease. e.mu held.
func (e *Execution) nextWake(now time.Time) time.Duration {
	d := e.g.cfg.Lease / 3
	d = min(d, e.maxUntil.Sub(now), e.validUntil.Sub(now))
	return max(d, 0)
}

// expiresIn is how long until the context must be cancelled: the end of
// the lease last confirmed, or of the maximum execution time. e.mu held.
func (e *Execution) expiresIn(now time.Time) time.Duration {
	return max(min(e.validUntil.Sub(now), e.maxUntil.Sub(now)), 0)
}

// expiredCause is the cause to cancel the context with at now, if the
// maximum execution time or the lease last confirmed has ended. e.mu held.
func (e *Execution) expiredCause(now time.Time) error {
	switch {
	case !now.Before(e.maxUntil):
		return ErrMaxExecution
	case !now.Before(e.validUntil):
		return ErrLeaseLost
	}
	return nil
}

// wake sets the timer to fire after d. e.mu held.
func (e *Execution) wake(now time.Time, d time.Duration) {
	e.wakeAt = now.Add(d)
	e.setDue()
	e.timer.Reset(d)
}

// setDue publishes when the context must end, for Err. e.mu held.
func (e *Execution) setDue() {
	if !e.running() {
		e.due.Store(math.MaxInt64)
		return
	}
	end := e.validUntil
	if e.maxUntil.Before(end) {
		end = e.maxUntil
	}
	e.due.Store(int64(end.Sub(e.base)))
}

// expire ends the watchdog and cancels the context if the lease last
// confirmed, or the maximum execution time, has ended while the watchdog
// runs (what tick does when its timer fires then).
func (e *Execution) expire() {
	e.mu.Lock()
	if !e.running() {
		e.mu.Unlock()
		return
	}
	l := e.lease
	cause := e.expiredCause(time.Now())
	if cause != nil {
		e.endWatch(cause)
	}
	e.mu.Unlock()
	e.report(l, cause, nil)
}

// halt stops the timer and cancels the running renewal, if any; its
// outcome will be ignored (it is not waited for: a store that ignores its
// context must not hold up the completion). e.mu held.
func (e *Execution) halt() {
	e.epoch++
	e.due.Store(math.MaxInt64)
	e.timer.Stop()
	e.renewing = false
	if e.renewCancel != nil {
		e.renewCancel()
		e.renewCancel = nil
	}
}

// endWatch ends the watchdog for good, and the context with cause
// (unless it is nil). The context ends before e.mu is let go: once the
// watchdog is over, Err no longer checks the clock, so work that asked
// between the two would find the context live past the lease's end, or
// after the store said the lease was lost. e.mu held.
func (e *Execution) endWatch(cause error) {
	if cause != nil {
		e.cancel(cause)
	}
	e.watchOver = true
	e.halt()
}

// resume restarts the watchdog after a pause, unless something else
// still holds it. If the lease or the maximum execution time ended
// during the pause, it ends the watchdog instead and returns the cause to
// cancel the context with. e.mu held.
func (e *Execution) resume() error {
	if !e.running() {
		return nil
	}
	now := time.Now()
	if cause := e.expiredCause(now); cause != nil {
		e.endWatch(cause)
		return cause
	}
	// The next renewal is due a third into the lease last confirmed (at
	// once if that has passed).
	due := e.validUntil.Add(e.g.cfg.Lease/3 - e.g.cfg.Lease).Sub(now)
	e.wake(now, max(min(due, e.nextWake(now)), 0))
	return nil
}

// tick runs in the timer's goroutine. Once the maximum execution time or
// the lease last confirmed has ended, it ends the watchdog and cancels
// the context, whether or not a renewal still waits for its answer.
// Otherwise, unless a renewal is running (its answer sets the timer
// again), it renews the lease: the Extend is bounded by a third of the
// lease and by the end of the lease last confirmed, and the timer is set
// to that end meanwhile. The renewal's answer schedules the next one (a
// third later, or soon after a failure: retry.After), or ends the
// watchdog when the store says the lease is lost or the answer came
// after the lease had ended.
func (e *Execution) tick() {
	ttl := e.g.cfg.Lease
	e.mu.Lock()
	if !e.running() {
		e.mu.Unlock()
		return
	}
	l := e.lease
	now := time.Now()
	if cause := e.expiredCause(now); cause != nil {
		e.endWatch(cause)
		e.mu.Unlock()
		e.report(l, cause, nil)
		return
	}
	if e.renewing || now.Before(e.wakeAt) {
		// A renewal waits for its answer, which sets the timer again; or
		// this is a run of the timer set before it was last reset.
		e.mu.Unlock()
		return
	}
	epoch := e.epoch
	deadline := now.Add(ttl / 3)
	if e.validUntil.Before(deadline) {
		deadline = e.validUntil
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(&e.ctx), deadline)
	e.renewing, e.renewCancel = true, cancel
	e.wake(now, e.expiresIn(now))
	e.mu.Unlock()

	sent := time.Now()
	var nl Lease
	var err error
	if o := e.g.obs; o != nil {
		nl, err = o.extend(ctx, l, ttl, e.kh.Hash)
	} else {
		nl, err = e.g.store.Extend(ctx, l, ttl)
	}
	cancel()

	e.mu.Lock()
	if epoch != e.epoch { // halted while the renewal ran: its outcome is stale
		e.mu.Unlock()
		return
	}
	e.renewing, e.renewCancel = false, nil
	now = time.Now()
	// After a completion that may have committed, a record no longer
	// processing may be that very completion: whether the lease was lost
	// is for the completion's retry to tell (settle reports it then).
	ownCompletion := e.unsure && errors.Is(err, ErrLeaseLost)
	var cause error
	if errors.Is(err, ErrLeaseLost) {
		cause = ErrLeaseLost
	} else if cause = e.expiredCause(now); cause == nil && err == nil {
		e.lease.Until = nl.Until
		e.validUntil = sent.Add(ttl)
	}
	switch {
	case cause != nil:
		e.endWatch(cause)
	case err != nil:
		e.retryIn = retry.After(e.retryIn, e.g.cfg.Lease)
		e.wake(now, min(e.retryIn, e.nextWake(now)))
	default:
		e.retryIn = 0
		e.wake(now, e.nextWake(now))
	}
	e.mu.Unlock()
	if o := e.g.cfg.Observer; o != nil && !errors.Is(err, ErrLeaseLost) && (err != nil || cause == nil) {
		outcome := OutcomeRenewed
		if err != nil {
			outcome = OutcomeRenewFailed
		}
		o.End(&e.ctx, Event{Kind: KindLease, Op: OpExtend, Outcome: outcome, Store: e.g.cfg.StoreName,
			Duration: now.Sub(sent), Err: err, KeyHash: e.keyHash(l)})
	}
	if ownCompletion {
		e.g.cfg.Logger.DebugContext(&e.ctx, "idem: renewal found the record no longer processing after a completion of unknown outcome; its retry will tell whether the lease was lost",
			LogKey(l.Scope, l.Key, e.g.cfg.LogKeys), slog.Int64(LogFence, l.Fence))
		return
	}
	e.report(l, cause, err)
}

// report logs what the watchdog found (err: a renewal's error; cause:
// why the watchdog ended, if it did: endWatch has cancelled the context
// with it, so a slow log never leaves the context live past the lease).
func (e *Execution) report(l Lease, cause, err error) {
	log := e.g.cfg.Logger
	switch {
	case errors.Is(err, ErrLeaseLost):
		log.WarnContext(&e.ctx, "idem: lease lost", LogKey(l.Scope, l.Key, e.g.cfg.LogKeys), slog.Int64(LogFence, l.Fence))
	case err != nil:
		log.WarnContext(&e.ctx, "idem: lease renewal failed", LogKey(l.Scope, l.Key, e.g.cfg.LogKeys), slog.Int64(LogFence, l.Fence), slog.Any(LogErr, err))
	}
	if errors.Is(cause, ErrLeaseLost) && !errors.Is(err, ErrLeaseLost) {
		log.WarnContext(&e.ctx, "idem: lease may have ended: no renewal confirmed it in time", LogKey(l.Scope, l.Key, e.g.cfg.LogKeys), slog.Int64(LogFence, l.Fence))
	}
	if errors.Is(cause, ErrLeaseLost) {
		e.lost(l)
	}
}

// lost reports the lease l lost to the observer, if any, once per
// execution (the watchdog and the completion may both find it lost).
func (e *Execution) lost(l Lease) {
	o := e.g.cfg.Observer
	if o == nil {
		return
	}
	e.mu.Lock()
	shown := e.lostShown
	e.lostShown = true
	e.mu.Unlock()
	if !shown {
		o.End(&e.ctx, Event{Kind: KindLease, Outcome: OutcomeLost, Store: e.g.cfg.StoreName,
			Err: ErrLeaseLost, KeyHash: e.keyHash(l)})
	}
}

// pause suspends the watchdog for a completion call and returns the
// lease to present; settle must follow the call. A completion call also
// means that the transaction of an earlier CompleteTx has ended.
func (e *Execution) pause() (Lease, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.finished {
		return Lease{}, ErrFinished
	}
	e.completing++
	e.txOpen = false
	e.halt()
	return e.lease, nil
}

// settle ends a completion call with its outcome err. The execution ends
// when err is nil (for CompleteTx, holdTx: the transaction is still open,
// and the watchdog stays paused until Committed reports on it), when err
// is ErrLeaseLost (the record is no longer the execution's: cause
// ErrLeaseLost), or ErrFinished (the completion had already committed).
// Any other error means the store did not answer: the execution stays
// open and the watchdog resumes.
func (e *Execution) settle(err error, holdTx bool) {
	e.mu.Lock()
	e.completing--
	l := e.lease
	var cause, expired error
	switch {
	case err == nil && holdTx:
		e.txOpen = true
	case err == nil, errors.Is(err, ErrFinished):
		e.finished = true
		cause = context.Canceled
		e.endWatch(cause)
	case errors.Is(err, ErrLeaseLost):
		e.finished = true
		cause = ErrLeaseLost
		e.endWatch(cause)
	default:
		e.unsure = true
		expired = e.resume()
	}
	e.mu.Unlock()
	if cause == ErrLeaseLost {
		e.lost(l)
	}
	e.report(l, expired, nil)
}

// Complete stores resp and ends the execution. ErrLeaseLost means another
// execution took the key over: resp was not stored. Any other error (the
// store is unreachable) leaves the execution open and its watchdog
// running again, so Complete may be called again (a store answers nil
// when a retry finds the record already completed by this very lease,
// after a reply was lost), or Release or Abandon.
func (e *Execution) Complete(ctx context.Context, resp Response) error {
	l, err := e.pause()
	if err != nil {
		return err
	}
	resp = e.g.prepare(resp)
	if o := e.g.obs; o != nil {
		err = o.complete(e.bound(ctx), l, resp, e.g.cfg.Retention, e.kh.Hash)
	} else {
		err = e.g.store.Complete(e.bound(ctx), l, resp, e.g.cfg.Retention)
	}
	e.unbound()
	if err == nil {
		// Committed reports it, so that a caller that lets work complete
		// by itself (Do, idemhttp) hands out what was stored.
		e.mu.Lock()
		e.kept = resp
		e.pending, e.committed = &e.kept, true
		e.mu.Unlock()
	}
	e.settle(err, false)
	return err
}

// CompleteRetrying is Complete, tried again while it fails with a store
// error (not ErrLeaseLost, nor ErrFinished), after 20 ms and then twice as
// long each time up to 1 s, for up to GuardConfig.CompleteRetry after the
// first failure (a retry still running then is cut short) and while ctx
// lasts. A retry is safe: a store answers nil
// when it finds the record already completed by this lease (the first
// attempt committed and its reply was lost). The execution's watchdog
// goes on renewing the lease between attempts. It returns the last
// error; the execution is then still open (Release or Abandon it).
func (e *Execution) CompleteRetrying(ctx context.Context, resp Response) error {
	err := e.Complete(ctx, resp)
	if err == nil || errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrFinished) || e.g.cfg.CompleteRetry < 0 {
		return err
	}
	deadline := time.Now().Add(e.g.cfg.CompleteRetry)
	// A retry ends with the deadline too, not StoreTimeout later: a store
	// that hangs rather than fails must not hold the caller (and its
	// client) past CompleteRetry.
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		if time.Until(deadline) < wait {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		if err = e.Complete(ctx, resp); err == nil || errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrFinished) {
			return err
		}
	}
}

// CompleteTx completes the record inside tx, so that the work's effect and
// the stored response commit together or not at all. While tx is open the
// watchdog stays paused: tx holds the record's row, so nobody can take the
// lease over, and the execution's context is not cancelled (that would
// roll back a transaction begun with it). After the transaction ends,
// Committed reports its outcome. The store must implement TxCompleter
// (sqlstore does), else ErrTxUnsupported.
//
// ErrLeaseLost ends the execution: another execution took the key over,
// roll tx back. An error matching ErrFinished means that this very
// lease's completion had already committed (a retry of CompleteTx after
// the reply of an earlier commit was lost): roll tx back; the execution
// is finished and Committed reports the stored response. Any other error
// leaves the execution open and its watchdog running again.
func (e *Execution) CompleteTx(ctx context.Context, tx *sql.Tx, resp Response) error {
	txc, ok := e.g.store.(TxCompleter)
	if !ok {
		return ErrTxUnsupported
	}
	l, err := e.pause()
	if err != nil {
		return err
	}
	resp = e.g.prepare(resp)
	if o, ok := txc.(interface {
		completeTx(context.Context, *sql.Tx, Lease, Response, time.Duration, string) error
	}); ok {
		err = o.completeTx(ctx, tx, l, resp, e.g.cfg.Retention, e.kh.Hash)
	} else {
		err = txc.CompleteTx(ctx, tx, l, resp, e.g.cfg.Retention)
	}
	if err == nil || errors.Is(err, ErrFinished) {
		e.mu.Lock()
		e.kept = resp
		e.pending = &e.kept
		e.mu.Unlock()
	}
	e.settle(err, true)
	return err
}

// Committed reports whether a completion made by CompleteTx (or by
// Complete) committed; if so it ends the execution and returns the stored
// response, which is what every replay will serve. It asks the store (one
// Get) only when CompleteTx was called and has not been confirmed yet;
// otherwise it answers at no cost. Call it once the
// transaction has ended. When the transaction rolled back, the execution
// stays open and its watchdog resumes: Complete or Release it.
func (e *Execution) Committed(ctx context.Context) (Response, bool, error) {
	e.mu.Lock()
	pending, l, committed := e.pending, e.lease, e.committed
	e.mu.Unlock()
	if committed {
		return *pending, true, nil
	}
	if pending == nil {
		return Response{}, false, nil
	}
	var rec Record
	var err error
	if o := e.g.obs; o != nil {
		rec, err = o.get(e.bound(ctx), l.Scope, l.Key, e.kh.Hash)
	} else {
		rec, err = e.g.store.Get(e.bound(ctx), l.Scope, l.Key)
	}
	e.unbound()
	if err == nil && rec.Status == StatusCompleted && rec.Owner == l.Owner && rec.Fence == l.Fence && rec.Response != nil {
		e.mu.Lock()
		e.pending, e.committed = rec.Response, true
		e.finished, e.txOpen = true, false
		e.endWatch(context.Canceled)
		e.mu.Unlock()
		return *rec.Response, true, nil
	}
	// The transaction has ended (it rolled back, or the store cannot say
	// how): the watchdog resumes. If it committed, the next renewal finds
	// the lease gone.
	e.mu.Lock()
	if err == nil || errors.Is(err, ErrNotFound) {
		e.pending = nil
	}
	e.txOpen = false
	cause := e.resume()
	e.mu.Unlock()
	e.report(l, cause, nil)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return Response{}, false, err
	}
	return Response{}, false, nil
}

// Confirm tells the execution that the transaction of its successful
// CompleteTx committed (tx.Commit returned nil): the execution ends, and
// Committed answers with the response handed to CompleteTx without
// asking the store. Call it only then; after a Commit that failed, call
// Committed, which asks. Confirm does nothing when no CompleteTx
// succeeded.
func (e *Execution) Confirm() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.pending == nil || e.committed {
		return
	}
	e.committed = true
	e.finished, e.txOpen = true, false
	e.endWatch(context.Canceled)
}

// Release deletes the record so that a retry runs the work again, and ends
// the execution. ErrLeaseLost means the record is no longer this
// execution's (nothing was deleted). Any other error leaves the execution
// open and its watchdog running again.
func (e *Execution) Release(ctx context.Context) error {
	l, err := e.pause()
	if err != nil {
		return err
	}
	err = e.release(e.bound(ctx), l)
	e.unbound()
	e.settle(err, false)
	return err
}

// Abandon ends the execution without touching the store: the record is
// left to its lease, after which a retry may take it over. Use it when the
// store cannot be reached to complete or release. A renewal in flight is
// cancelled, not waited for.
func (e *Execution) Abandon() {
	e.mu.Lock()
	e.finished = true
	e.endWatch(context.Canceled)
	e.mu.Unlock()
}
