package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/keyhash"
)

// Retry-After values, in seconds.
const (
	retryAfterProcessing  = "1"
	retryAfterUnavailable = "1"
)

// Bounds of the Wait mode's polling interval.
const (
	minPoll = 5 * time.Millisecond
	maxPoll = 250 * time.Millisecond
)

// Handler returns next guarded by m: the func(http.Handler) http.Handler
// shape of net/http middleware. It panics if next is nil.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	if next == nil {
		panic("idemhttp: Handler(nil)")
	}
	return &guarded{m: m, next: next}
}

type guarded struct {
	m    *Middleware
	next http.Handler
}

func (g *guarded) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !g.m.covers(r.Method) {
		g.next.ServeHTTP(w, r)
		return
	}
	if g.m.obs != nil {
		g.m.serveObserved(w, r, g.next)
		return
	}
	g.m.serve(w, r, g.next, nil)
}

// reqObs is what an observed request reports when it ends: the outcome
// and error, and the key once known. A nil *reqObs (no Observer) records
// nothing.
type reqObs struct {
	outcome string
	err     error
	kh      keyhash.Value // the key and its hash, once known
	// Context is the context of the guard's Begin, which o is: it hands
	// the key's hash to the guard without an allocation (see begin).
	context.Context
}

func (o *reqObs) set(outcome string, err error) {
	if o != nil {
		o.outcome, o.err = outcome, err
	}
}

// setKey records the request's key, and computes its hash: once per
// request, for its event, its store calls' and its lease's.
func (o *reqObs) setKey(scope, key string) {
	if o != nil {
		o.kh = keyhash.Value{Scope: scope, Key: key, Hash: idem.HashKey(scope, key)}
	}
}

// begin returns the context for the guard's Begin: ctx, carrying the
// key's hash when o has it.
func (o *reqObs) begin(ctx context.Context) context.Context {
	if o == nil || o.kh.Hash == "" {
		return ctx
	}
	if o.Context == nil {
		o.Context = ctx
	} else if o.Context != ctx {
		return ctx
	}
	return o
}

// Value returns the key's hash for keyhash.CtxKey, else ctx's value.
func (o *reqObs) Value(k any) any {
	if k == (keyhash.CtxKey{}) {
		return &o.kh
	}
	return o.Context.Value(k)
}

// serveObserved serves a guarded request, reporting it to the Observer:
// Start before anything is read, End with the outcome when the answer is
// decided (or the handler panicked: OutcomeReleased, and the panic goes on).
func (m *Middleware) serveObserved(w http.ResponseWriter, r *http.Request, next http.Handler) {
	route := m.routeOf(r)
	ctx := m.obs.Start(r.Context(), idem.Event{Kind: idem.KindRequest, Route: route, Store: m.storeName})
	if ctx == nil {
		ctx = r.Context()
	} else if ctx != r.Context() { // a tracer's span: the handler and the store calls run in it
		r = r.WithContext(ctx)
	}
	o := &reqObs{outcome: idem.OutcomeReleased, err: errHandlerPanicked}
	t0 := time.Now()
	defer func() {
		e := idem.Event{Kind: idem.KindRequest, Route: route, Store: m.storeName, Outcome: o.outcome,
			Duration: time.Since(t0), Err: o.err}
		e.KeyHash = o.kh.Hash
		m.obs.End(ctx, e)
	}()
	m.serve(w, r, next, o)
}

var errHandlerPanicked = errors.New("idemhttp: the handler panicked")

// routeOf is the request's bounded route name: Config.Route's, else the
// pattern of the ServeMux route that matched it, else "".
func (m *Middleware) routeOf(r *http.Request) string {
	if m.route != nil {
		return m.route(r)
	}
	return r.Pattern
}

// covers reports whether requests with method are guarded.
func (m *Middleware) covers(method string) bool {
	if m.defaultMethods {
		return method == http.MethodPost || method == http.MethodPatch
	}
	for _, c := range m.methods {
		if c == method {
			return true
		}
	}
	return false
}

// exchange is the per-request state of a guarded request. It is not
// pooled: a handler that (wrongly) keeps the writer or the body past its
// return must never reach another request's.
type exchange struct {
	rec      recorder
	body     bodyReader
	spooled  *spoolReader // the body, when it was spooled
	detached detachedContext
	header   http.Header // the response header as it was before the handler ran, if not empty
}

// detachedContext carries the values of a request's context without its
// cancellation or deadline: the store calls that end an execution run
// even when the client has gone. (context.WithoutCancel, without an
// allocation of its own.)
type detachedContext struct{ parent context.Context }

func (*detachedContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*detachedContext) Done() <-chan struct{}       { return nil }
func (*detachedContext) Err() error                  { return nil }
func (c *detachedContext) Value(key any) any         { return c.parent.Value(key) }
func (c *detachedContext) String() string            { return "idemhttp.detached" }

// bodyReader is the request body the handler reads: the bytes the
// middleware read and fingerprinted.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

// buffers are the pooled byte slices of an exchange.
type buffers struct {
	req  []byte
	resp []byte
}

var buffersPool = sync.Pool{New: func() any { return new(buffers) }}

func (b *buffers) release() {
	if cap(b.req) > maxPooledScratch {
		b.req = nil
	}
	if cap(b.resp) > maxPooledScratch {
		b.resp = nil
	}
	b.req, b.resp = b.req[:0], b.resp[:0]
	buffersPool.Put(b)
}

// serve handles a request whose method is guarded.
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler, o *reqObs) {
	var key string
	if m.key == nil {
		values := r.Header[HeaderIdempotencyKey]
		if len(values) == 0 {
			if m.keyOptional {
				o.set(idem.OutcomePassed, nil)
				next.ServeHTTP(w, r)
				return
			}
			o.set(idem.OutcomeMissingKey, nil)
			WriteProblem(w, http.StatusBadRequest, CodeMissingKey, "Idempotency key required",
				"this request needs an Idempotency-Key header with a value unique to it")
			return
		}
		if len(values) > 1 {
			o.set(idem.OutcomeInvalidKey, nil)
			WriteProblem(w, http.StatusBadRequest, CodeInvalidKey, "Invalid idempotency key",
				"the request has more than one Idempotency-Key header field")
			return
		}
		var err error
		if key, err = ParseKey(values[0]); err != nil {
			o.set(idem.OutcomeInvalidKey, err)
			WriteProblem(w, http.StatusBadRequest, CodeInvalidKey, "Invalid idempotency key", err.Error())
			return
		}
	}
	scope, ok := m.scopeOf(w, r, o)
	if !ok {
		return
	}

	bufs := buffersPool.Get().(*buffers)
	defer bufs.release()
	body, err := m.readRequestBody(r, bufs.req)
	bufs.req = body.mem
	if err != nil {
		var tooLarge *http.MaxBytesError
		var spoolErr *spoolError
		switch {
		case errors.Is(err, errBodyTooLarge) || errors.As(err, &tooLarge):
			limit := m.maxReq
			if m.maxStreamed > 0 {
				limit = m.maxStreamed
			}
			o.set(idem.OutcomeTooLarge, nil)
			WriteProblem(w, http.StatusRequestEntityTooLarge, CodeBodyTooLarge, "Request body too large",
				"the request body is larger than "+strconv.FormatInt(limit, 10)+" bytes")
			return
		case errors.As(err, &spoolErr):
			o.set(idem.OutcomeStoreError, err)
			m.log.ErrorContext(r.Context(), "idemhttp: cannot spool the request body", slog.Any(idem.LogErr, err))
			w.Header()["Retry-After"] = []string{retryAfterUnavailable}
			WriteProblem(w, http.StatusServiceUnavailable, CodeSpoolUnavailable, "Service unavailable",
				"the server cannot hold the request body to fingerprint it; retry later with the same Idempotency-Key")
			return
		}
		o.set(idem.OutcomeInvalidRequest, err)
		m.log.DebugContext(r.Context(), "idemhttp: cannot read the request body", slog.Any(idem.LogErr, err))
		WriteProblem(w, http.StatusBadRequest, CodeInvalidRequest, "Invalid request", "the request body cannot be read")
		return
	}
	if body.spool != nil {
		defer body.spool.close()
	}
	if m.key != nil {
		// Never with a spool: New refuses Key with SpoolBody.
		if key, ok = m.derivedKey(w, r, body.mem, o); !ok {
			return
		}
		if key == "" { // KeyOptional
			o.set(idem.OutcomePassed, nil)
			m.runUnguarded(w, r, next, body)
			return
		}
	}
	o.setKey(scope, key)
	var fp idem.Fingerprint
	if body.spool != nil {
		fp = body.spool.fp // FingerprintV1's: New refuses Fingerprint with SpoolBody
	} else {
		fp, err = m.fingerprint(r, body.mem)
	}
	if err != nil {
		o.set(idem.OutcomeInvalidRequest, err)
		m.log.WarnContext(r.Context(), "idemhttp: cannot fingerprint the request", m.logKey(scope, key), slog.Any(idem.LogErr, err))
		WriteProblem(w, http.StatusBadRequest, CodeInvalidRequest, "Invalid request", "the request cannot be fingerprinted")
		return
	}
	m.acquire(w, r, next, bufs, scope, key, fp, body, o)
}

// logKey is the log attribute of (scope, key): its hash, and the scope
// and key themselves under Config.LogKeys.
func (m *Middleware) logKey(scope, key string) slog.Attr {
	return idem.LogKey(scope, key, m.logKeys)
}

// derivedKey returns the key Config.Key takes from the request, or
// answers the request and returns false. It returns "" and true for a
// request without a key under KeyOptional.
func (m *Middleware) derivedKey(w http.ResponseWriter, r *http.Request, body []byte, o *reqObs) (string, bool) {
	// Key gets a copy of the request whose Body reads body: r.Body is
	// drained already, and a form Key parses (r.FormValue) would be parsed
	// from nothing, then seen empty by the handler, whose request is a
	// copy of r.
	kr := r.WithContext(r.Context())
	rd := &bodyReader{}
	rd.Reset(body)
	defer rd.Reset(nil)
	kr.Body = rd
	kr.ContentLength = int64(len(body))
	key, err := m.key(kr, body)
	switch {
	case err != nil:
		o.set(idem.OutcomeInvalidKey, err)
		m.log.DebugContext(r.Context(), "idemhttp: no idempotency key in the request", slog.Any(idem.LogErr, err))
		WriteProblem(w, http.StatusBadRequest, CodeInvalidKey, "Invalid idempotency key",
			"the idempotency key cannot be taken from this request")
		return "", false
	case key == "" && m.keyOptional:
		return "", true
	case key == "":
		o.set(idem.OutcomeMissingKey, nil)
		WriteProblem(w, http.StatusBadRequest, CodeMissingKey, "Idempotency key required",
			"this request carries no idempotency key where this route takes it from")
		return "", false
	}
	if err := idem.ValidateKey(key); err != nil {
		o.set(idem.OutcomeInvalidKey, err)
		WriteProblem(w, http.StatusBadRequest, CodeInvalidKey, "Invalid idempotency key",
			"the idempotency key taken from this request is invalid: "+err.Error())
		return "", false
	}
	return key, true
}

// scopeOf returns the request's scope, or answers the request and
// returns false.
func (m *Middleware) scopeOf(w http.ResponseWriter, r *http.Request, o *reqObs) (string, bool) {
	if m.scope == nil {
		return "", true
	}
	// Scope sees a copy whose body cannot be read: the body is the
	// middleware's to read (for the fingerprint) and the handler's; a
	// Scope that parsed a form would drain it, and the fingerprint would
	// be taken over nothing.
	sr := r.WithContext(r.Context())
	sr.Body = scopeBody{}
	scope, err := m.scope(sr)
	if err != nil {
		o.set(idem.OutcomeUnauthenticated, err)
		var se *ScopeError
		if errors.As(err, &se) {
			WriteProblem(w, se.status(), se.code(), "", se.Detail)
		} else {
			WriteProblem(w, http.StatusUnauthorized, CodeUnauthenticated, "Unauthenticated", "the caller cannot be identified")
		}
		m.log.DebugContext(r.Context(), "idemhttp: no scope", slog.Any(idem.LogErr, err))
		return "", false
	}
	if err := idem.ValidateScope(scope); err != nil {
		o.set(idem.OutcomeUnauthenticated, err)
		m.log.WarnContext(r.Context(), "idemhttp: invalid scope", slog.Any(idem.LogErr, err))
		WriteProblem(w, http.StatusBadRequest, CodeInvalidScope, "Invalid scope",
			"the caller's identity cannot scope an idempotency key")
		return "", false
	}
	return scope, true
}

// errScopeReadsBody is what Config.Scope reads from a request body.
var errScopeReadsBody = errors.New("idemhttp: Config.Scope must not read the request body (derive the scope from headers, the URL or the context)")

// scopeBody is the body of the request Config.Scope sees.
type scopeBody struct{}

func (scopeBody) Read([]byte) (int, error) { return 0, errScopeReadsBody }
func (scopeBody) Close() error             { return nil }

var errBodyTooLarge = errors.New("idemhttp: request body too large")

// readBody reads r's body into buf, refusing more than limit bytes.
func readBody(r *http.Request, limit int64, buf []byte) ([]byte, error) {
	if r.Body != nil && r.Body != http.NoBody && r.ContentLength > limit {
		return buf[:0], errBodyTooLarge
	}
	buf, err := readAtMost(r, limit, buf)
	if err != nil {
		return buf[:0], err
	}
	return buf, nil
}

// readAtMost reads r's body into buf until it ends or buf holds more than
// limit bytes: then it returns errBodyTooLarge, with the limit+1 bytes
// read in buf.
func readAtMost(r *http.Request, limit int64, buf []byte) ([]byte, error) {
	buf = buf[:0]
	if r.Body == nil || r.Body == http.NoBody {
		return buf, nil
	}
	if want := min(r.ContentLength, limit); want > 0 && int64(cap(buf)) <= want {
		buf = make([]byte, 0, want+1)
	}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		end := cap(buf)
		if int64(end) > limit+1 {
			end = int(limit + 1)
		}
		n, err := r.Body.Read(buf[len(buf):end])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			return buf, errBodyTooLarge
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// acquire takes the key and runs the handler, replays, or refuses.
func (m *Middleware) acquire(w http.ResponseWriter, r *http.Request, next http.Handler, bufs *buffers, scope, key string, fp idem.Fingerprint, body requestBody, o *reqObs) {
	ctx := r.Context()
	var deadline time.Time // of the Wait mode, once a first Acquire saw the key in flight
	for {
		exec, res, err := m.guard.Begin(o.begin(ctx), scope, key, fp)
		if err != nil {
			o.set(idem.OutcomeStoreError, err)
			switch {
			case errors.Is(err, idem.ErrInvalidKey):
				o.set(idem.OutcomeInvalidKey, err)
				WriteProblem(w, http.StatusBadRequest, CodeInvalidKey, "Invalid idempotency key", err.Error())
			case errors.Is(err, idem.ErrInvalidScope):
				o.set(idem.OutcomeUnauthenticated, err)
				WriteProblem(w, http.StatusBadRequest, CodeInvalidScope, "Invalid scope",
					"the caller's identity cannot scope an idempotency key")
			case ctx.Err() != nil:
				m.log.DebugContext(ctx, "idemhttp: request ended before the key was acquired", m.logKey(scope, key), slog.Any(idem.LogErr, err))
				m.unavailable(w)
			case m.failOpen && deadline.IsZero():
				m.log.WarnContext(ctx, "idemhttp: store unavailable; running the handler unguarded (FailOpen)",
					m.logKey(scope, key), slog.Any(idem.LogErr, err))
				m.runUnguarded(w, r, next, body)
			default:
				m.log.ErrorContext(ctx, "idemhttp: store unavailable", m.logKey(scope, key), slog.Any(idem.LogErr, err))
				m.unavailable(w)
			}
			return
		}
		switch res.Outcome {
		case idem.Acquired:
			if res.TookOver {
				m.log.InfoContext(ctx, "idemhttp: took over a key whose lease ended", m.logKey(scope, key), slog.Int64(idem.LogFence, res.Lease.Fence))
			}
			m.run(w, r, next, bufs, exec, fp, body, o)
			return
		case idem.Completed:
			m.replay(w, r, res.Record, o)
			return
		case idem.Mismatch:
			o.set(idem.OutcomeMismatch, nil)
			m.mismatch(w)
			return
		case idem.InFlight:
			if m.wait <= 0 {
				o.set(idem.OutcomeInFlight, nil)
				m.processing(w)
				return
			}
			if deadline.IsZero() {
				deadline = time.Now().Add(m.wait)
			}
			rec, outcome, err := m.poll(ctx, scope, key, fp, deadline)
			switch outcome {
			case pollReplay:
				m.replay(w, r, rec, o)
				return
			case pollMismatch:
				o.set(idem.OutcomeMismatch, nil)
				m.mismatch(w)
				return
			case pollAcquire:
				continue
			case pollTimeout:
				o.set(idem.OutcomeInFlight, nil)
				m.processing(w)
				return
			default:
				o.set(idem.OutcomeStoreError, err)
				m.log.ErrorContext(ctx, "idemhttp: store unavailable while waiting", m.logKey(scope, key), slog.Any(idem.LogErr, err))
				m.unavailable(w)
				return
			}
		default:
			o.set(idem.OutcomeStoreError, nil)
			m.log.ErrorContext(ctx, "idemhttp: store returned an unknown outcome", "outcome", res.Outcome.String())
			m.unavailable(w)
			return
		}
	}
}

type pollOutcome int

const (
	pollReplay   pollOutcome = iota + 1 // the record completed
	pollMismatch                        // the key now holds another request
	pollAcquire                         // the record is gone or its lease ended: try Acquire
	pollTimeout                         // still in flight at the deadline, or the request ended
	pollError                           // the store failed
)

// poll waits for the in-flight record of (scope, key) to change, reading
// it with Get at growing intervals, until deadline or the end of ctx.
func (m *Middleware) poll(ctx context.Context, scope, key string, fp idem.Fingerprint, deadline time.Time) (idem.Record, pollOutcome, error) {
	delay := minPoll
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		remaining := time.Until(deadline)
		if remaining <= 0 {
			return idem.Record{}, pollTimeout, nil
		}
		// ±25% jitter, so that many waiters do not poll in step.
		d := min(delay*3/4+rand.N(delay/2+1), remaining)
		timer.Reset(d)
		select {
		case <-ctx.Done():
			return idem.Record{}, pollTimeout, nil
		case <-timer.C:
		}
		rec, err := m.get(ctx, scope, key)
		switch {
		case errors.Is(err, idem.ErrNotFound):
			return idem.Record{}, pollAcquire, nil // released: a retry may run it
		case err != nil:
			if ctx.Err() != nil {
				return idem.Record{}, pollTimeout, nil
			}
			return idem.Record{}, pollError, err
		case rec.Fingerprint != fp:
			return idem.Record{}, pollMismatch, nil
		case rec.Status == idem.StatusCompleted:
			return rec, pollReplay, nil
		case !time.Now().Before(rec.LeaseUntil):
			// The lease looks over on this clock; Acquire decides on the
			// store's clock and takes the key over if it is.
			return idem.Record{}, pollAcquire, nil
		}
		delay = min(delay*2, maxPoll)
	}
}

// get reads the record for the Wait mode, bounded by the guard's
// StoreTimeout like the guard's own calls.
func (m *Middleware) get(ctx context.Context, scope, key string) (idem.Record, error) {
	if t := m.guard.Config().StoreTimeout; t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t)
		defer cancel()
	}
	return m.store.Get(ctx, scope, key)
}

// run runs the handler under exec and ends the execution.
func (m *Middleware) run(w http.ResponseWriter, r *http.Request, next http.Handler, bufs *buffers, exec *idem.Execution, fp idem.Fingerprint, body requestBody, o *reqObs) {
	ex := &exchange{}
	if h := w.Header(); len(h) > 0 {
		// Set before the handler (by a middleware around this one): kept
		// if the handler's response must be replaced (a lost lease).
		ex.header = h.Clone()
	}
	rec := &ex.rec
	rec.w, rec.m, rec.buf, rec.ctx = w, m, bufs.resp[:0], exec.Context()
	r2 := r.WithContext(exec.Context())
	if body.spool == nil {
		ex.body.Reset(body.mem)
		r2.Body = &ex.body
	} else {
		ex.spooled = &spoolReader{}
		ex.spooled.set(body)
		r2.Body = ex.spooled
	}
	r2.ContentLength = body.size()
	ex.detached.parent = r.Context()
	bg := &ex.detached

	returned := false
	defer func() {
		// The handler is done with the writer and the body: make any late
		// use fail, and hand the buffers back.
		rec.done = true
		ex.body.Reset(nil)
		if ex.spooled != nil {
			ex.spooled.reset()
		}
		bufs.resp, rec.buf = rec.buf[:0], nil
		if returned {
			return
		}
		// The handler panicked (or called runtime.Goexit): release the key
		// so that a retry runs again, and let the panic go on. A handler
		// that ended its execution first (Abandon, say, before aborting
		// with http.ErrAbortHandler) has decided the record's fate: it is
		// left as the handler left it.
		l := exec.Lease()
		switch err := m.releaseExec(bg, exec); {
		case err == nil:
			m.log.WarnContext(bg, "idemhttp: handler panicked; key released", m.logKey(l.Scope, l.Key))
		case errors.Is(err, idem.ErrFinished):
			m.log.DebugContext(bg, "idemhttp: handler panicked after it ended its execution; record left as it was", m.logKey(l.Scope, l.Key))
		case errors.Is(err, idem.ErrLeaseLost):
			m.log.WarnContext(bg, "idemhttp: handler panicked after its lease was lost; the key is another execution's", m.logKey(l.Scope, l.Key))
		}
		// Other errors: releaseExec logged that the key is left to its lease.
	}()
	next.ServeHTTP(rec, r2)
	returned = true
	m.finish(bg, r, exec, fp, ex, o)
}

// finish ends exec after the handler returned, then answers the client.
// ctx is detached from the request's; r is the request.
func (m *Middleware) finish(ctx context.Context, r *http.Request, exec *idem.Execution, fp idem.Fingerprint, ex *exchange, o *reqObs) {
	rec := &ex.rec
	if rec.hijacked {
		var err error
		released := m.releases(rec)
		if released {
			err = m.releaseExec(ctx, exec)
		} else {
			err = m.complete(ctx, exec, rec.response())
		}
		o.setEnded(released, exec, err)
		if leaseLost(exec, err) {
			m.log.WarnContext(ctx, "idemhttp: lease lost after the response had started (hijacked); "+
				"the client got this execution's response, which no retry replays",
				m.logKey(exec.Lease().Scope, exec.Lease().Key), slog.Int(idem.LogStatus, rec.finalStatus()))
		}
		return
	}
	stored, committed, err := exec.Committed(ctx)
	switch {
	case err != nil:
		// The handler completed in its transaction, and whether that
		// committed cannot be read: leave the record to its lease.
		exec.Abandon()
		o.set(idem.OutcomeStoreError, err)
		m.log.ErrorContext(ctx, "idemhttp: cannot read whether the handler's completion committed; key left to its lease",
			m.logKey(exec.Lease().Scope, exec.Lease().Key), slog.Any(idem.LogErr, err))
		rec.send()
		return
	case committed:
		o.set(idem.OutcomeExecuted, nil)
		rec.sendCommitted(stored)
		return
	}
	released := m.releases(rec)
	if released {
		err = m.releaseExec(ctx, exec)
	} else {
		err = m.complete(ctx, exec, rec.response())
	}
	o.setEnded(released, exec, err)
	if leaseLost(exec, err) {
		m.answerLost(r, exec, fp, ex)
		return
	}
	rec.send()
}

// setEnded records the outcome of an execution ended by the middleware
// (released or completed, with err).
func (o *reqObs) setEnded(released bool, exec *idem.Execution, err error) {
	switch {
	case o == nil:
	case leaseLost(exec, err):
		o.set(idem.OutcomeLeaseLost, err)
	case errors.Is(err, idem.ErrFinished), err == nil:
		if released {
			o.set(idem.OutcomeReleased, nil)
		} else {
			o.set(idem.OutcomeExecuted, nil)
		}
	default:
		// The response was sent but could not be stored (or released):
		// the record is left to its lease.
		o.set(idem.OutcomeStoreError, err)
	}
}

// leaseLost reports whether the execution lost its key to another: err,
// from ending it, is ErrLeaseLost, or ErrFinished (the handler ended it)
// with the execution cancelled for a lost lease.
func leaseLost(exec *idem.Execution, err error) bool {
	return errors.Is(err, idem.ErrLeaseLost) ||
		errors.Is(err, idem.ErrFinished) && errors.Is(context.Cause(exec.Context()), idem.ErrLeaseLost)
}

// answerLost answers the request whose execution lost its key with what a
// retry would get now, in place of the handler's response, which no retry
// will ever replay: the response of the execution that took the key over
// (replayed) if it completed, else 409 PROCESSING. A response that has
// started (flushed or streamed) cannot be taken back: it is finished as
// it is.
func (m *Middleware) answerLost(r *http.Request, exec *idem.Execution, fp idem.Fingerprint, ex *exchange) {
	rec := &ex.rec
	l := exec.Lease()
	ctx := r.Context()
	if rec.forwarded {
		m.log.WarnContext(ctx, "idemhttp: lease lost after the response had started; "+
			"the client got this execution's response, which no retry replays",
			m.logKey(l.Scope, l.Key), slog.Int(idem.LogStatus, rec.finalStatus()))
		rec.send()
		return
	}
	got, err := m.get(ctx, l.Scope, l.Key)
	if err == nil && got.Owner == l.Owner && got.Fence == l.Fence && got.Status == idem.StatusCompleted {
		// The handler's own completion was stored after all (it completed
		// the execution itself before its context said the lease was
		// lost): its response is what retries get.
		rec.send()
		return
	}
	rec.discard(ex.header)
	w := rec.w
	switch {
	case err == nil && got.Fingerprint == fp && got.Status == idem.StatusCompleted && got.Response != nil:
		m.log.WarnContext(ctx, "idemhttp: lease lost; the client gets the response of the execution that took the key over",
			m.logKey(l.Scope, l.Key), slog.Int64(idem.LogFence, l.Fence), "winner_fence", got.Fence)
		m.replay(w, r, got, nil)
	case err == nil && got.Fingerprint == fp && got.Status == idem.StatusProcessing:
		m.log.WarnContext(ctx, "idemhttp: lease lost; the execution that took the key over still runs: answered 409",
			m.logKey(l.Scope, l.Key), slog.Int64(idem.LogFence, l.Fence), "winner_fence", got.Fence)
		m.processing(w)
	default:
		var state string
		switch {
		case errors.Is(err, idem.ErrNotFound):
			state = "record not found"
		case err != nil:
			state = "record unreadable"
		case got.Fingerprint != fp:
			state = "key taken by another request"
		default:
			state = "record completed without a response"
		}
		attrs := []any{m.logKey(l.Scope, l.Key), slog.Int64(idem.LogFence, l.Fence), "record", state}
		if err != nil {
			attrs = append(attrs, slog.Any(idem.LogErr, err))
		}
		m.log.WarnContext(ctx, "idemhttp: lease lost, and the key holds no response to replay: answered 409", attrs...)
		m.processing(w)
	}
}

// complete stores resp and ends exec; it returns the store's error (after
// logging those that are not about a lost lease).
func (m *Middleware) complete(ctx context.Context, exec *idem.Execution, resp idem.Response) error {
	err := exec.CompleteRetrying(ctx, resp)
	switch {
	case err == nil, errors.Is(err, idem.ErrFinished), errors.Is(err, idem.ErrLeaseLost):
		// ErrFinished: the handler ended the execution itself.
		// ErrLeaseLost: see answerLost.
	default:
		exec.Abandon()
		m.log.ErrorContext(ctx, "idemhttp: response sent but not stored; key left to its lease",
			m.logKey(exec.Lease().Scope, exec.Lease().Key), slog.Int(idem.LogStatus, resp.StatusCode), slog.Any(idem.LogErr, err))
	}
	return err
}

// releaseExec releases exec's record; it returns the store's error (after
// logging those that are not about a lost lease).
func (m *Middleware) releaseExec(ctx context.Context, exec *idem.Execution) error {
	err := exec.Release(ctx)
	switch {
	case err == nil, errors.Is(err, idem.ErrFinished), errors.Is(err, idem.ErrLeaseLost):
	default:
		exec.Abandon()
		m.log.ErrorContext(ctx, "idemhttp: cannot release the key; left to its lease",
			m.logKey(exec.Lease().Scope, exec.Lease().Key), slog.Any(idem.LogErr, err))
	}
	return err
}

// runUnguarded runs the handler without a record (FailOpen).
func (m *Middleware) runUnguarded(w http.ResponseWriter, r *http.Request, next http.Handler, body requestBody) {
	r2 := r.WithContext(r.Context())
	if body.spool == nil {
		rd := &bodyReader{}
		rd.Reset(body.mem)
		defer rd.Reset(nil)
		r2.Body = rd
	} else {
		rd := &spoolReader{}
		rd.set(body)
		defer rd.reset()
		r2.Body = rd
	}
	r2.ContentLength = body.size()
	next.ServeHTTP(w, r2)
}

// replay answers with a stored response: its replayable headers only,
// whoever stored it (a record written by an earlier version, or by a
// writer without this middleware's filter, may hold Set-Cookie).
func (m *Middleware) replay(w http.ResponseWriter, r *http.Request, rec idem.Record, o *reqObs) {
	if rec.Response == nil {
		o.set(idem.OutcomeStoreError, nil)
		m.log.ErrorContext(r.Context(), "idemhttp: completed record without a response", m.logKey(rec.Scope, rec.Key))
		m.unavailable(w)
		return
	}
	o.set(idem.OutcomeReplayed, nil)
	resp := *rec.Response
	resp.Header = m.replayableHeader(resp.Header)
	w.Header()[HeaderReplayed] = []string{"true"}
	WriteResponse(w, resp)
}

func (m *Middleware) mismatch(w http.ResponseWriter) {
	WriteProblem(w, http.StatusUnprocessableEntity, CodeKeyMismatch, "Idempotency key reused",
		"this Idempotency-Key was used with a different request; use a new key for a new request")
}

func (m *Middleware) processing(w http.ResponseWriter) {
	w.Header()["Retry-After"] = []string{retryAfterProcessing}
	WriteProblem(w, http.StatusConflict, CodeProcessing, "Request in progress",
		"a request with this Idempotency-Key is still being processed; retry later with the same key")
}

func (m *Middleware) unavailable(w http.ResponseWriter) {
	w.Header()["Retry-After"] = []string{retryAfterUnavailable}
	WriteProblem(w, http.StatusServiceUnavailable, CodeStoreUnavailable, "Service unavailable",
		"the idempotency store cannot be reached; retry later with the same Idempotency-Key")
}
