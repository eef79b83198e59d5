package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem"
)

// Defaults of Config.
const (
	// DefaultMaxRequestBody is the largest request body the middleware
	// reads (and fingerprints) when Config.MaxRequestBody is 0.
	DefaultMaxRequestBody = 1 << 20
	// DefaultMaxResponseBody is the largest response body a record keeps
	// when Config.MaxResponseBody is 0.
	DefaultMaxResponseBody = 1 << 20
	// DefaultMaxStreamedBody is the largest request body a middleware
	// with Config.SpoolBody accepts when Config.MaxStreamedBody is 0.
	DefaultMaxStreamedBody = 1 << 30
)

// Config configures a Middleware. The zero value of each field means its
// default; only Store is required.
type Config struct {
	// Store keeps the idempotency records. Required.
	Store idem.Store

	// Methods are the request methods the middleware guards; requests with
	// other methods pass through untouched. Methods are case-sensitive, as
	// in HTTP: "post" is rejected by New, "POST" is meant. Nil or empty
	// means POST and PATCH.
	Methods []string

	// KeyOptional lets a guarded request without an Idempotency-Key header
	// through to the handler, unguarded. False (the default) answers it
	// 400 MISSING_KEY. A malformed key is answered 400 INVALID_KEY either
	// way.
	KeyOptional bool

	// Key, when set, takes each guarded request's idempotency key from the
	// request itself instead of the Idempotency-Key header, which is then
	// ignored: for callbacks of a third party (a payment provider's
	// notification) that carry no Idempotency-Key but a natural key, in
	// the body (a trade number) or in a header of the provider's (an event
	// id). body is the request body, read in full (at most MaxRequestBody
	// bytes) and fingerprinted as usual; Key must not keep or change it.
	// r is a copy of the request whose Body reads body, so Key may parse a
	// form (r.PostFormValue("out_trade_no")): what it parses stays in that
	// copy, and the handler still gets the whole body.
	//
	// The key returned goes through the same validation as a header's
	// (idem.ValidateKey: 1 to 255 bytes of UTF-8 without control
	// characters): one it refuses is answered 400 INVALID_KEY, so the
	// record's key stays the provider's identifier, readable when an
	// operator inspects it. A natural key that may hold any bytes or be
	// longer should be hashed by Key itself (hex of its SHA-256, say).
	// An empty key is answered 400 MISSING_KEY (or, with KeyOptional, runs
	// the handler unguarded); an error is answered 400 INVALID_KEY, with a
	// detail that does not show the error (it is logged at debug level).
	//
	// The key is taken, and recorded, before the handler runs: a request
	// the handler then refuses as forged holds the key while it runs, and
	// its refusal is stored unless the release policy releases it (the
	// default releases 401 and 403, not a 400 or a 422). Anyone who knows
	// a trade number (often an order number the customer sees) could send
	// a forged notification first, and the provider's genuine one would
	// be answered 409 while it runs, or 422 KEY_MISMATCH until the record
	// expires. Verify the provider's signature in Key, and return an error
	// for a request that fails it: no record is made.
	//
	// Nil means the Idempotency-Key header.
	Key func(r *http.Request, body []byte) (string, error)

	// Scope returns the caller's identity (tenant, account, user): equal
	// keys in different scopes never meet. It must derive the scope from
	// authenticated identity, never from input the caller chooses freely.
	// Nil means "" for every request: one key space shared by every caller,
	// so one caller's key can replay another caller's response. Use nil
	// only when there is a single caller, or the keys are unguessable and
	// responses hold nothing private.
	//
	// Scope gets a copy of the request whose body cannot be read (reads
	// fail; r.FormValue sees only the URL's query): the body belongs to
	// the fingerprint and the handler.
	//
	// An error answers the request 401 UNAUTHENTICATED without running the
	// handler, or with the status, code and detail of a *ScopeError it
	// wraps. A scope that idem.ValidateScope refuses is answered 400
	// INVALID_SCOPE.
	Scope func(r *http.Request) (string, error)

	// Fingerprint computes the request's fingerprint from the request and
	// its body (read in full, at most MaxRequestBody bytes). It must not
	// keep body after it returns, nor read r.Body. An error answers 400
	// INVALID_REQUEST. Nil means FingerprintV1. It cannot be combined
	// with SpoolBody: a spooled body is never all in memory.
	Fingerprint func(r *http.Request, body []byte) (idem.Fingerprint, error)

	// Lease, MaxExecution and Retention configure the idem.Guard: how long
	// an execution holds its key without renewal (renewed every third of
	// it), how long the watchdog renews it at most, and how long a completed
	// response is replayed. Zero means idem.DefaultLease (30 s),
	// idem.DefaultMaxExecution (5 min) and idem.DefaultRetention (24 h).
	Lease, MaxExecution, Retention time.Duration

	// StoreTimeout bounds each store call that acquires or ends a request's
	// execution (idem.GuardConfig.StoreTimeout), and each read of the Wait
	// mode: an Acquire or a read that runs out is answered 503
	// STORE_UNAVAILABLE; a completion that runs out still sends the
	// handler's response, and the record is left to its lease.
	// Zero means idem.DefaultStoreTimeout (5 s); negative means no bound
	// beyond the request's context.
	StoreTimeout time.Duration

	// CompleteRetry is how long a completion that failed on a store error
	// is tried again before the client gets its answer
	// (idem.GuardConfig.CompleteRetry): a response the store did not keep
	// lets a retry run the handler again once the lease has run out. Zero
	// means idem.DefaultCompleteRetry (10 s); negative means one attempt.
	CompleteRetry time.Duration

	// MaxRequestBody is the largest request body accepted on a guarded
	// request; a larger one is answered 413 BODY_TOO_LARGE before any
	// record is created. Zero means DefaultMaxRequestBody (1 MiB). With
	// SpoolBody it is the largest body held in memory instead: a larger
	// one is spooled, up to MaxStreamedBody.
	MaxRequestBody int64

	// SpoolBody lets guarded requests carry bodies larger than
	// MaxRequestBody (uploads) without holding them in memory. The
	// fingerprint must be known before the key is acquired, so the whole
	// body is still read before the handler runs; its first
	// MaxRequestBody bytes (and one) stay in memory, the rest is written
	// to a temporary file in SpoolDir while it is hashed, and the handler
	// gets a body that reads both. The file is unlinked as soon as it is
	// created (where the system allows it; else removed when the request
	// ends) and closed when the request ends, the handler's panic
	// included, so neither a finished request nor a dead process leaves
	// it behind. A body within MaxRequestBody is read and fingerprinted
	// as without SpoolBody; a spooled one is fingerprinted as raw bytes
	// whatever its Content-Type (see FingerprintV1). A body over
	// MaxStreamedBody is answered 413 BODY_TOO_LARGE; a body that cannot
	// be read (the client went away) 400 INVALID_REQUEST; a spool that
	// cannot be written (the disk is full) 503 SPOOL_UNAVAILABLE
	// (reported to Observer as store_error): no record is made, and no
	// file is left.
	//
	// SpoolBody cannot be combined with Fingerprint or Key, which take
	// the whole body as a []byte: New refuses it. False (the default)
	// holds every body in memory.
	SpoolBody bool

	// MaxStreamedBody is the largest request body accepted with
	// SpoolBody; it must be larger than MaxRequestBody. A request whose
	// Content-Length is larger is answered 413 before its body is read,
	// one without Content-Length as soon as it has sent one byte more.
	// Zero means DefaultMaxStreamedBody (1 GiB). Setting it without
	// SpoolBody is refused by New.
	MaxStreamedBody int64

	// SpoolDir is the directory of SpoolBody's temporary files; New
	// refuses one that is not an existing directory. Each spooled request
	// holds at most MaxStreamedBody bytes there while it runs. Empty
	// means os.TempDir(). Setting it without SpoolBody is refused by New.
	SpoolDir string

	// MaxResponseBody is the largest response body a record keeps, on
	// every path (a response the handler passes to Execution.Complete or
	// CompleteTx included). A larger response still reaches the client in
	// full; the record keeps its status and replayable headers and marks
	// the body omitted. Zero means DefaultMaxResponseBody (1 MiB).
	MaxResponseBody int64

	// Release reports whether a handler's final status releases the record
	// (so that a retry runs the handler again) instead of storing the
	// response. Nil means DefaultRelease: 5xx, 401, 403, 407, 408, 425 and
	// 429. To keep 5xx as Stripe does:
	//
	//	func(s int) bool { return s < 500 && idemhttp.DefaultRelease(s) }
	//
	// Whatever Release says, an answer that tells the client to try again
	// is never stored: 429, 503, and any 4xx or 5xx with a Retry-After
	// header (a 409 PROCESSING of an upstream that is itself idempotent,
	// say). Storing it would replay "try again later" for the record's
	// retention, and a client that honours the replay stops retrying.
	Release func(status int) bool

	// Wait is how long a retry that arrives while the first request is
	// running waits for it to finish, polling the store, before it is
	// answered. Zero answers it at once 409 PROCESSING with Retry-After;
	// positive waits up to Wait (and no longer than the request's context)
	// and replays the first request's response, or answers 409 if it is
	// still running.
	Wait time.Duration

	// FailOpen chooses what happens when the store cannot be reached to
	// acquire the key: false (the default) answers 503 STORE_UNAVAILABLE
	// with Retry-After; true runs the handler unguarded (logged at warn
	// level), at the risk of running the effect twice.
	FailOpen bool

	// ReplayHeaders are response headers stored and replayed in addition to
	// the allow-list (Content-Type, Content-Encoding, Content-Language,
	// Content-Disposition, Location, ETag, Last-Modified). Set-Cookie,
	// Authorization, Proxy-Authorization and hop-by-hop headers (Connection,
	// Keep-Alive, Proxy-*, TE, Trailer, Transfer-Encoding, Upgrade) are
	// refused by New, as are the headers the middleware sets itself.
	ReplayHeaders []string

	// Logger receives store failures, fail-open runs and lost leases. Nil
	// discards them. Lines identify a key by its hash (idem.key_hash)
	// only, unless LogKeys is set.
	Logger *slog.Logger

	// LogKeys adds the scope and the key themselves (idem.scope, idem.key)
	// to the log lines that concern a key. Keys and scopes may identify
	// users or carry secrets: false, the default, logs only their hash.
	LogKeys bool

	// Observer, when set, receives one KindRequest event per guarded
	// request (Start when the middleware takes it, End with its Outcome:
	// executed, replayed, in_flight, mismatch, missing_key, invalid_key,
	// invalid_request, unauthenticated, store_error, too_large,
	// lease_lost, released, or passed for a request let through without a
	// key under KeyOptional), the store calls made for it (KindStore,
	// started from the context the request's Start returned), and the
	// lease events of its execution. Requests whose method is not guarded
	// are not reported. Nil reports nothing and costs one comparison per
	// request.
	Observer idem.Observer

	// Route names a request's route in the events reported to Observer. It
	// must return a bounded set of values (a route template, never the
	// raw path, which holds identifiers). Nil means the pattern of the
	// http.ServeMux route that matched the request (r.Pattern, Go 1.22+),
	// which is "" when the middleware wraps the mux rather than a route.
	Route func(r *http.Request) string

	// StoreName is the Store of the events reported to Observer ("memory",
	// "sqlite", "postgres", "mysql", "redis", "tiered"). Empty means
	// idem.DefaultStoreName.
	StoreName string
}

// DefaultRelease is the release policy when Config.Release is nil: a
// handler status of 5xx, 401 Unauthorized, 403 Forbidden, 407 Proxy
// Authentication Required, 408 Request Timeout, 425 Too Early or 429 Too
// Many Requests releases the record, so a retry runs the handler again.
// The authentication answers are released because they refuse the
// caller's credentials, not the request: the retry with a refreshed token
// (or the header that was missing) must reach the handler, not get the
// stale refusal replayed.
func DefaultRelease(status int) bool {
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusProxyAuthRequired,
		http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return status >= 500
}

// tryAgain reports whether an answer tells the client to try again later,
// which no release policy may store: 429 Too Many Requests, 503 Service
// Unavailable, and any error status (4xx, 5xx) with a Retry-After header.
// A 2xx or 3xx with Retry-After is a definite answer that only paces a
// follow-up request (a 202 Accepted naming a job to poll), and is stored.
func tryAgain(status int, h http.Header) bool {
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		return true
	}
	if status < 400 {
		return false
	}
	if len(h["Retry-After"]) > 0 {
		return true
	}
	for name, values := range h { // a name set in the map as it is, not canonical
		if len(values) > 0 && strings.EqualFold(name, "Retry-After") {
			return true
		}
	}
	return false
}

// releases reports whether the handler's response in rec releases the
// record: it tells the client to try again, or Config.Release selects its
// status.
func (m *Middleware) releases(rec *recorder) bool {
	status := rec.finalStatus()
	return tryAgain(status, rec.finalHeader()) || m.release(status)
}

// ScopeError lets a Config.Scope function choose the answer to a request
// whose caller cannot be identified. Return it (or an error wrapping it)
// from Scope; any other error is answered 401 UNAUTHENTICATED.
type ScopeError struct {
	// Status is the HTTP status of the answer, 400 to 599. Other values
	// mean 401.
	Status int
	// Code is the problem's code; "" means "UNAUTHENTICATED".
	Code string
	// Detail is the problem's detail, shown to the client.
	Detail string
	// Err is the underlying error, logged but not shown to the client.
	Err error
}

// Error returns the code, detail and underlying error.
func (e *ScopeError) Error() string {
	msg := "idemhttp: scope: " + e.code()
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns e.Err.
func (e *ScopeError) Unwrap() error { return e.Err }

func (e *ScopeError) status() int {
	if e.Status < 400 || e.Status > 599 {
		return http.StatusUnauthorized
	}
	return e.Status
}

func (e *ScopeError) code() string {
	if e.Code == "" {
		return CodeUnauthenticated
	}
	return e.Code
}

// Middleware guards HTTP handlers with idempotency keys; see the package
// documentation for what it answers. Build it with New; it is safe for
// concurrent use. One Middleware carries one configuration: for routes
// that need another (a different Wait, Scope or body limit), derive one
// with With and wrap those routes with it.
type Middleware struct {
	user  Config // as given to New, slices cloned; With starts from it
	guard *idem.Guard
	store idem.Store
	log   *slog.Logger

	obs       idem.Observer
	route     func(*http.Request) string
	storeName string
	logKeys   bool

	defaultMethods bool
	methods        []string
	replayHeaders  []string // allow-listed header names, canonical
	scope          func(*http.Request) (string, error)
	key            func(*http.Request, []byte) (string, error)
	fingerprint    func(*http.Request, []byte) (idem.Fingerprint, error)
	release        func(int) bool
	maxReq         int64
	maxResp        int64
	maxStreamed    int64 // 0: no spooling
	spoolDir       string
	wait           time.Duration
	keyOptional    bool
	failOpen       bool
}

// defaultReplayHeaders is the allow-list of replayable response headers.
var defaultReplayHeaders = []string{
	"Content-Type",
	"Content-Encoding",
	"Content-Language",
	"Content-Disposition",
	"Location",
	"Etag",
	"Last-Modified",
}

// New returns a Middleware for cfg, which it copies. It refuses a nil cfg
// or Store, negative sizes and durations, malformed methods and header
// names, and replay headers that must never be stored.
func New(cfg *Config) (*Middleware, error) {
	if cfg == nil {
		return nil, errors.New("idemhttp: New needs a Config with a Store")
	}
	c := *cfg
	c.Methods = slices.Clone(c.Methods)
	c.ReplayHeaders = slices.Clone(c.ReplayHeaders)
	if c.Store == nil {
		return nil, errors.New("idemhttp: Config.Store is required")
	}
	switch {
	case c.MaxRequestBody < 0:
		return nil, fmt.Errorf("idemhttp: negative MaxRequestBody %d", c.MaxRequestBody)
	case c.MaxResponseBody < 0:
		return nil, fmt.Errorf("idemhttp: negative MaxResponseBody %d", c.MaxResponseBody)
	case c.Wait < 0:
		return nil, fmt.Errorf("idemhttp: negative Wait %v", c.Wait)
	}
	if err := checkSpool(&c); err != nil {
		return nil, err
	}
	logger := c.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m := &Middleware{
		user:        c,
		store:       c.Store,
		log:         logger,
		scope:       c.Scope,
		key:         c.Key,
		fingerprint: c.Fingerprint,
		release:     c.Release,
		maxReq:      c.MaxRequestBody,
		maxResp:     c.MaxResponseBody,
		wait:        c.Wait,
		keyOptional: c.KeyOptional,
		failOpen:    c.FailOpen,
		obs:         c.Observer,
		route:       c.Route,
		storeName:   c.StoreName,
		logKeys:     c.LogKeys,
	}
	if m.storeName == "" {
		m.storeName = idem.DefaultStoreName
	}
	if m.fingerprint == nil {
		m.fingerprint = FingerprintV1
	}
	if m.release == nil {
		m.release = DefaultRelease
	}
	if m.maxReq == 0 {
		m.maxReq = DefaultMaxRequestBody
	}
	if m.maxResp == 0 {
		m.maxResp = DefaultMaxResponseBody
	}
	if c.SpoolBody {
		m.maxStreamed = c.MaxStreamedBody
		if m.maxStreamed == 0 {
			m.maxStreamed = DefaultMaxStreamedBody
		}
		m.spoolDir = c.SpoolDir
	}

	if len(c.Methods) == 0 {
		m.defaultMethods = true
	}
	for _, method := range c.Methods {
		if err := checkMethod(method); err != nil {
			return nil, err
		}
		if !slices.Contains(m.methods, method) {
			m.methods = append(m.methods, method)
		}
	}

	m.replayHeaders = slices.Clone(defaultReplayHeaders)
	for _, name := range c.ReplayHeaders {
		if !isToken(name) {
			return nil, fmt.Errorf("idemhttp: ReplayHeaders: %q is not a header name", name)
		}
		canon := http.CanonicalHeaderKey(name)
		if neverReplayed(canon) {
			return nil, fmt.Errorf("idemhttp: ReplayHeaders: %s is never stored or replayed", canon)
		}
		if !slices.ContainsFunc(m.replayHeaders, func(s string) bool { return strings.EqualFold(s, canon) }) {
			m.replayHeaders = append(m.replayHeaders, canon)
		}
	}

	// Every response an execution stores, whoever stores it (the
	// middleware, or the handler with Complete or CompleteTx), goes
	// through storable.
	guard, err := idem.NewGuard(c.Store, &idem.GuardConfig{
		Lease:         c.Lease,
		MaxExecution:  c.MaxExecution,
		Retention:     c.Retention,
		StoreTimeout:  c.StoreTimeout,
		CompleteRetry: c.CompleteRetry,
		Logger:        logger,
		Prepare:       m.storable,
		Observer:      c.Observer,
		StoreName:     m.storeName,
		LogKeys:       c.LogKeys,
	})
	if err != nil {
		return nil, fmt.Errorf("idemhttp: %w", err)
	}
	m.guard = guard
	m.store = guard.Store() // observed, when Observer is set
	return m, nil
}

// checkSpool refuses spooling options that cannot work: spool settings
// without SpoolBody, SpoolBody with a function that needs the whole body
// in memory, a streamed limit not above the in-memory one, and a SpoolDir
// that is not a directory.
func checkSpool(c *Config) error {
	if c.MaxStreamedBody < 0 {
		return fmt.Errorf("idemhttp: negative MaxStreamedBody %d", c.MaxStreamedBody)
	}
	if !c.SpoolBody {
		switch {
		case c.MaxStreamedBody != 0:
			return errors.New("idemhttp: MaxStreamedBody is set but SpoolBody is not; set SpoolBody to accept bodies over MaxRequestBody")
		case c.SpoolDir != "":
			return errors.New("idemhttp: SpoolDir is set but SpoolBody is not")
		}
		return nil
	}
	switch {
	case c.Fingerprint != nil:
		return errors.New("idemhttp: SpoolBody cannot be combined with a custom Fingerprint, which takes the whole body in memory")
	case c.Key != nil:
		return errors.New("idemhttp: SpoolBody cannot be combined with Key, which takes the whole body in memory")
	}
	maxReq, maxStreamed := c.MaxRequestBody, c.MaxStreamedBody
	if maxReq == 0 {
		maxReq = DefaultMaxRequestBody
	}
	if maxStreamed == 0 {
		maxStreamed = DefaultMaxStreamedBody
	}
	if maxStreamed <= maxReq {
		return fmt.Errorf("idemhttp: MaxStreamedBody (%d) must be larger than MaxRequestBody (%d), the part of a body held in memory", maxStreamed, maxReq)
	}
	if c.SpoolDir != "" {
		fi, err := os.Stat(c.SpoolDir)
		if err != nil {
			return fmt.Errorf("idemhttp: SpoolDir: %w", err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("idemhttp: SpoolDir %q is not a directory", c.SpoolDir)
		}
	}
	return nil
}

// storable returns what a record keeps of resp: the replayable headers
// only (under their canonical names, empty ones dropped), and no body but
// the BodyOmitted marker when the body is over MaxResponseBody. It is the
// guard's Prepare, so it filters every response an execution stores. It
// never changes resp's header map or body, and returns resp as it is when
// there is nothing to drop.
func (m *Middleware) storable(resp idem.Response) idem.Response {
	if resp.BodyOmitted || int64(len(resp.Body)) > m.maxResp {
		resp.Body, resp.BodyOmitted = nil, true
	}
	resp.Header = m.replayableHeader(resp.Header)
	return resp
}

// replayableHeader returns the replayable headers of header (under their
// canonical names, empty ones dropped): header itself when it holds
// nothing else, else a new map.
func (m *Middleware) replayableHeader(header map[string][]string) map[string][]string {
	keep := true
	for name, values := range header {
		if len(values) == 0 || !m.replayable(name) || http.CanonicalHeaderKey(name) != name {
			keep = false
			break
		}
	}
	if keep {
		return header
	}
	var h map[string][]string
	for name, values := range header {
		if len(values) == 0 || !m.replayable(name) {
			continue
		}
		if h == nil {
			h = make(map[string][]string, 4)
		}
		// Two spellings of one name (ETag, Etag) were both sent: keep both.
		canon := http.CanonicalHeaderKey(name)
		h[canon] = append(slices.Clip(h[canon]), values...)
	}
	return h
}

// With returns a Middleware whose configuration is m's, changed by fn
// (which gets a copy); use it for per-route options. The new Middleware
// shares m's store and nothing else.
func (m *Middleware) With(fn func(*Config)) (*Middleware, error) {
	c := m.user
	c.Methods = slices.Clone(c.Methods)
	c.ReplayHeaders = slices.Clone(c.ReplayHeaders)
	if fn != nil {
		fn(&c)
	}
	return New(&c)
}

// checkMethod refuses an empty method, one that is not an HTTP token, and
// the lower-case spelling of a standard method (HTTP methods are
// case-sensitive, so "post" would never match a POST request).
func checkMethod(method string) error {
	if !isToken(method) {
		return fmt.Errorf("idemhttp: Methods: %q is not an HTTP method", method)
	}
	for _, std := range []string{
		http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace,
	} {
		if method != std && strings.EqualFold(method, std) {
			return fmt.Errorf("idemhttp: Methods: %q never matches; methods are case-sensitive, use %q", method, std)
		}
	}
	return nil
}

// neverReplayed reports the (canonical) header names that are never
// stored: credentials, cookies, hop-by-hop headers and the middleware's own.
func neverReplayed(canon string) bool {
	switch canon {
	case "Set-Cookie", "Set-Cookie2", "Authorization", "Cookie",
		"Connection", "Keep-Alive", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
		HeaderReplayed, HeaderBodyOmitted, HeaderIdempotencyKey:
		return true
	}
	return strings.HasPrefix(canon, "Proxy-")
}

// isToken reports whether s is a non-empty RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// ExecutionFrom returns the execution a guarded request runs under, from
// the request's context (r.Context() in the handler), or nil outside a
// guarded request (pass-through, KeyOptional without a key, fail-open). It
// is idem.FromContext.
func ExecutionFrom(ctx context.Context) *idem.Execution {
	return idem.FromContext(ctx)
}
