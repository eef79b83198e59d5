package idem

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Defaults of GuardConfig.
const (
	DefaultLease        = 30 * time.Second
	DefaultMaxExecution = 5 * time.Minute
	DefaultRetention    = 24 * time.Hour
	DefaultStoreTimeout = 5 * time.Second
)

// GuardConfig configures a Guard. The zero value of each field means its
// default.
type GuardConfig struct {
	// Lease is how long an execution holds its key without renewal; the
	// watchdog renews it every third of it. Default 30 s; at least 3 ms.
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
	// like any store failure. (A renewal is bounded by a third of the lease;
	// CompleteTx runs under the caller's context and transaction.) Default
	// 5 s; negative means no bound beyond the caller's context.
	StoreTimeout time.Duration
	// Logger receives the watchdog's warnings. Nil discards them.
	Logger *slog.Logger
	// Prepare, when set, turns every response an execution stores into the
	// response that is kept: Complete and CompleteTx store what it returns,
	// and Committed reports that. idemhttp uses it to keep only replayable
	// headers and to omit bodies over its limit, on every path. It must not
	// modify resp's header map or body in place. Nil keeps responses as
	// given.
	Prepare func(resp Response) Response
}

// Guard runs executions against a Store: acquire, renew the lease while the
// work runs, then complete with the fence or release. A Guard is safe for
// concurrent use.
type Guard struct {
	store Store
	cfg   GuardConfig
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
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return &Guard{store: s, cfg: c}, nil
}

// prepare applies the configured Prepare to resp.
func (g *Guard) prepare(resp Response) Response {
	if g.cfg.Prepare == nil {
		return resp
	}
	return g.cfg.Prepare(resp)
}

// Store returns the guard's store.
func (g *Guard) Store() Store { return g.store }

// Config returns the guard's configuration with defaults filled in.
func (g *Guard) Config() GuardConfig { return g.cfg }

// Begin acquires (scope, key). When the outcome is Acquired it returns a
// running Execution whose watchdog renews the lease; the caller must end it
// with Complete, CompleteTx, Release or Abandon. For the other outcomes the
// Execution is nil and the result holds the record found.
func (g *Guard) Begin(ctx context.Context, scope, key string, fp Fingerprint) (*Execution, AcquireResult, error) {
	req := AcquireRequest{Scope: scope, Key: key, Fingerprint: fp, Lease: g.cfg.Lease, Retention: g.cfg.Retention}
	if err := req.Validate(); err != nil {
		return nil, AcquireResult{}, err
	}
	// The execution is made first: its bounded context serves the Acquire.
	e := &Execution{g: g}
	sent := time.Now() // the lease is counted from no later than this
	res, err := g.store.Acquire(e.bound(ctx), req)
	e.unbound()
	if err != nil || res.Outcome != Acquired {
		return nil, res, err
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
// retry runs work again. If work succeeds but the completion cannot be
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
			_ = exec.Release(bg) // work panicked; let a retry run
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
	if cerr := exec.Complete(bg, resp); cerr != nil {
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

func (c *execContext) Value(key any) any {
	if key == (ctxKey{}) {
		return c.e
	}
	return c.Context.Value(key)
}

// Execution is one run of work under a lease. Its methods are safe for
// concurrent use.
type Execution struct {
	g      *Guard
	ctx    execContext
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	lease    Lease
	finished bool
	pending  *Response // set by CompleteTx, confirmed by Committed
	// committed reports that Committed confirmed pending in the store.
	committed bool

	// The watchdog: a timer, and a renewal running in the timer's goroutine.
	// No goroutine lives between renewals.
	timer       *time.Timer
	stopped     bool
	renewing    chan struct{}      // closed when the running renewal ends; nil if none runs
	renewCancel context.CancelFunc // cancels the running renewal
	validUntil  time.Time          // local, conservative estimate of the lease's end
	maxUntil    time.Time          // end of the maximum execution time

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
	e.validUntil = acquireSent.Add(g.cfg.Lease)
	e.maxUntil = acquireSent.Add(g.cfg.MaxExecution)
	cctx, cancel := context.WithCancelCause(parent)
	e.ctx = execContext{Context: cctx, e: e}
	e.cancel = cancel
	e.mu.Lock()
	e.timer = time.AfterFunc(e.nextWake(time.Now()), e.renew)
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

// Context is the work's context. It is cancelled with cause ErrLeaseLost
// when the watchdog loses the lease, with ErrMaxExecution after the maximum
// execution time, and when the execution ends. The watchdog keeps renewing
// the lease when only the parent context is cancelled (a client that went
// away): the lease lasts until the execution ends.
func (e *Execution) Context() context.Context { return &e.ctx }

// Lease returns the current lease (Until moves as the watchdog renews it).
func (e *Execution) Lease() Lease {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lease
}

// Retention is the retention the execution completes with.
func (e *Execution) Retention() time.Duration { return e.g.cfg.Retention }

// nextWake is how long the watchdog sleeps: a third of the lease, or less
// to meet the end of the maximum execution time or of the lease. e.mu held.
func (e *Execution) nextWake(now time.Time) time.Duration {
	d := e.g.cfg.Lease / 3
	d = min(d, e.maxUntil.Sub(now), e.validUntil.Sub(now))
	return max(d, 0)
}

// renew runs in the timer's goroutine: it extends the lease and schedules
// the next renewal, or cancels the work's context when the lease is lost
// or the maximum execution time is over.
func (e *Execution) renew() {
	ttl := e.g.cfg.Lease
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return
	}
	if !time.Now().Before(e.maxUntil) {
		e.stopped = true
		e.mu.Unlock()
		e.cancel(ErrMaxExecution)
		return
	}
	done := make(chan struct{})
	ctx, cancel := context.WithTimeout(context.WithoutCancel(&e.ctx), ttl/3)
	e.renewing, e.renewCancel = done, cancel
	l := e.lease
	e.mu.Unlock()

	sent := time.Now()
	nl, err := e.g.store.Extend(ctx, l, ttl)
	cancel()

	e.mu.Lock()
	e.renewing, e.renewCancel = nil, nil
	close(done)
	if e.stopped { // the execution ended while the renewal ran
		e.mu.Unlock()
		return
	}
	lost := false
	switch {
	case err == nil:
		e.lease.Until = nl.Until
		e.validUntil = sent.Add(ttl)
	case errors.Is(err, ErrLeaseLost):
		lost = true
	default:
		lost = !time.Now().Before(e.validUntil)
	}
	if lost {
		e.stopped = true
	} else {
		e.timer.Reset(e.nextWake(time.Now()))
	}
	e.mu.Unlock()

	switch {
	case errors.Is(err, ErrLeaseLost):
		e.g.cfg.Logger.WarnContext(&e.ctx, "idem: lease lost", "scope", l.Scope, "key", l.Key, "fence", l.Fence)
	case err != nil:
		e.g.cfg.Logger.WarnContext(&e.ctx, "idem: lease renewal failed", "scope", l.Scope, "key", l.Key, "fence", l.Fence, "error", err)
	}
	if lost {
		e.cancel(ErrLeaseLost)
	}
}

// stopWatch stops the watchdog; a renewal that is running is cancelled and
// waited for, so that none runs concurrently with the completion.
func (e *Execution) stopWatch() {
	e.mu.Lock()
	e.stopped = true
	e.timer.Stop()
	done, cancel := e.renewing, e.renewCancel
	e.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if done != nil {
		<-done
	}
}

func (e *Execution) begin() (Lease, error) {
	e.stopWatch()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.finished {
		return Lease{}, ErrFinished
	}
	return e.lease, nil
}

// end marks the execution finished when err says the store's record is no
// longer open to it (nil: done; ErrLeaseLost: taken over), and cancels its
// context with the matching cause.
func (e *Execution) end(err error) {
	cause := context.Canceled
	switch {
	case err == nil:
	case errors.Is(err, ErrLeaseLost):
		cause = ErrLeaseLost
	default:
		return // the store did not answer: the execution stays open
	}
	e.mu.Lock()
	e.finished = true
	e.mu.Unlock()
	e.cancel(cause)
}

// Complete stores resp and ends the execution. ErrLeaseLost means another
// execution took the key over: resp was not stored. Any other error (the
// store is unreachable) leaves the execution open, so Complete may be
// called again, or Abandon; the watchdog has stopped then, so a later
// Complete succeeds only if nobody took the key over once the lease ended.
func (e *Execution) Complete(ctx context.Context, resp Response) error {
	l, err := e.begin()
	if err != nil {
		return err
	}
	resp = e.g.prepare(resp)
	err = e.g.store.Complete(e.bound(ctx), l, resp, e.g.cfg.Retention)
	e.unbound()
	e.end(err)
	return err
}

// CompleteTx completes the record inside tx, so that the work's effect and
// the stored response commit together or not at all. It stops the
// watchdog: the record's row stays locked by tx until it commits or rolls
// back. After the transaction ends, Committed reports its outcome. The
// store must implement TxCompleter (sqlstore does), else ErrTxUnsupported.
func (e *Execution) CompleteTx(ctx context.Context, tx *sql.Tx, resp Response) error {
	txc, ok := e.g.store.(TxCompleter)
	if !ok {
		return ErrTxUnsupported
	}
	l, err := e.begin()
	if err != nil {
		return err
	}
	resp = e.g.prepare(resp)
	if err := txc.CompleteTx(ctx, tx, l, resp, e.g.cfg.Retention); err != nil {
		if errors.Is(err, ErrLeaseLost) {
			e.end(err)
		}
		return err
	}
	stored := resp
	e.mu.Lock()
	e.pending = &stored
	e.mu.Unlock()
	return nil
}

// Committed reports whether a completion made by CompleteTx committed; if
// so it ends the execution and returns the stored response, which is what
// every replay will serve. It asks the store (one Get) only when CompleteTx
// was called; otherwise it returns false at no cost. When the transaction
// rolled back, the execution stays open: Complete or Release it.
func (e *Execution) Committed(ctx context.Context) (Response, bool, error) {
	e.mu.Lock()
	pending, l, committed, finished := e.pending, e.lease, e.committed, e.finished
	e.mu.Unlock()
	if committed {
		return *pending, true, nil
	}
	if pending == nil || finished {
		return Response{}, false, nil
	}
	rec, err := e.g.store.Get(e.bound(ctx), l.Scope, l.Key)
	e.unbound()
	if err != nil && !errors.Is(err, ErrNotFound) {
		return Response{}, false, err
	}
	if err == nil && rec.Status == StatusCompleted && rec.Owner == l.Owner && rec.Fence == l.Fence && rec.Response != nil {
		e.mu.Lock()
		e.pending, e.committed = rec.Response, true
		e.mu.Unlock()
		e.end(nil)
		return *rec.Response, true, nil
	}
	e.mu.Lock()
	e.pending = nil
	e.mu.Unlock()
	return Response{}, false, nil
}

// Release deletes the record so that a retry runs the work again, and ends
// the execution. ErrLeaseLost means the record is no longer this
// execution's (nothing was deleted).
func (e *Execution) Release(ctx context.Context) error {
	l, err := e.begin()
	if err != nil {
		return err
	}
	err = e.g.store.Release(e.bound(ctx), l)
	e.unbound()
	e.end(err)
	return err
}

// Abandon ends the execution without touching the store: the record is
// left to its lease, after which a retry may take it over. Use it when the
// store cannot be reached to complete or release.
func (e *Execution) Abandon() {
	e.stopWatch()
	e.mu.Lock()
	e.finished = true
	e.mu.Unlock()
	e.cancel(context.Canceled)
}
