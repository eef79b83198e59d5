package idemcli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/admin"
	"github.com/idemkit/idem/cmd/internal/tracing"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemprom"
)

// Problem codes of the proxy's own answers.
const (
	// CodeUpstreamUnavailable: the upstream could not be reached; the
	// request never reached it, and the key is released.
	codeUpstreamUnavailable = "UPSTREAM_UNAVAILABLE"
	// CodeUpstreamOutcomeUnknown: the request reached the upstream and no
	// answer came (a timeout, a connection cut): whether its effect
	// happened is unknown.
	codeUpstreamOutcomeUnknown = "UPSTREAM_OUTCOME_UNKNOWN"
	// CodeUpgradeOnCoveredRoute: a covered request asked for a protocol
	// upgrade (WebSocket, h2c): the connection would become the
	// upstream's, with no answer to store and replay. It does not reach
	// the upstream.
	codeUpgradeOnCoveredRoute = "UPGRADE_ON_COVERED_ROUTE"
)

const proxyHelp = `Usage: idem proxy -upstream URL [flags]

idem proxy is an idempotency gateway: it runs in front of an HTTP service
written in any language and gives its covered routes the Idempotency-Key
semantics of package idemhttp. The first request with a key goes to the
upstream and its answer is stored; a retry with the same key and request
gets the stored answer (Idempotent-Replayed: true) without reaching the
upstream; a retry while the first is in flight gets 409 PROCESSING; the
same key with another request gets 422 KEY_MISMATCH; a covered request
without a key gets 400 MISSING_KEY.

Covered routes: -routes 'POST /orders,PATCH /orders/*' (METHOD PATH, the
path matched as by Go's path.Match: * matches within one segment), or
every POST and PATCH when -routes is not given. A path is matched as sent
and also cleaned and in lower case, so /orders/, //orders and /Orders,
which many services route to /orders, are covered with it. Other requests pass
straight through. A covered request that asks for a protocol upgrade
(Connection: Upgrade, as WebSocket does) is answered 400
UPGRADE_ON_COVERED_ROUTE and does not reach the upstream: an upgraded
connection has no answer to store and replay. Leave such routes out of
-routes; they then pass through, upgrade included.

Scope: with -scope-header X-Api-Key, the keys of different callers never
meet: the scope is the SHA-256 of that header's value (never stored as
is; idem inspect -scope-header-value computes it). A covered request
without the header is answered 401. Without -scope-header, every caller
shares one key space.

The upstream's answers:
  - 5xx, 408, 425 and 429 release the key: a retry goes to the upstream again;
  - so do 401, 403 and 407, which refuse the caller's credentials rather
    than the request: the retry with the header that was missing, or a
    refreshed token, reaches the upstream instead of the stale refusal;
  - an answer that says "try again" (429, 503, any 4xx or 5xx with
    Retry-After, such as the 409 PROCESSING of an upstream that is itself
    idempotent) is never stored;
  - other answers (2xx, 3xx, 4xx) are stored and replayed;
  - the upstream cannot be reached (connection refused, DNS, dial
    timeout): 502 UPSTREAM_UNAVAILABLE, the key is released;
  - the request reached the upstream and no answer came within
    -upstream-timeout (or the connection broke, or the body of the answer
    broke off or was cut at -max-execution): the outcome is unknown. By default (-ambiguous keep) the
    client gets 502 UPSTREAM_OUTCOME_UNKNOWN (or, when the body of the
    answer broke off, its own connection cut off) and the key stays in flight
    until its lease ends (-lease; it is no longer renewed): retries get
    409 PROCESSING and never reach the upstream within it, and the first
    retry after it goes to the upstream again. -ambiguous release releases
    the key instead, so the next retry goes to the upstream at once (and
    may repeat the effect).
The upstream gets its own host in the request (X-Forwarded-Host and
X-Forwarded-For carry the client's); a Location it answers that names
the upstream (under -upstream's path) becomes the same path on the proxy,
e.g. http://10.0.0.5:8080/api/orders/1 behind -upstream
http://10.0.0.5:8080/api becomes /orders/1.
A client that goes away does not cut a guarded request: the upstream's
answer is read to its end and stored, and the client's retry replays it.
Streaming answers (chunked, server-sent events) pass through as they come
and are stored when they end. A guarded request may take at most
-max-execution, streaming included.

-config FILE reads settings from a JSON object whose names are the flags'
names; flags given on the command line win:
  {"upstream": "http://127.0.0.1:8080", "scope-header": "X-Api-Key",
   "routes": ["POST /orders", "PATCH /orders/*"], "lease": "30s"}

` + storeHelp + `

idem proxy creates its tables in a SQL store when it starts. SIGINT or
SIGTERM stops it after the requests in flight are answered.`

// ambiguous policies.
const (
	ambiguousKeep    = "keep"
	ambiguousRelease = "release"
)

// proxyFlags are idem proxy's settings.
type proxyFlags struct {
	fs              *flag.FlagSet
	upstream        string
	listen          string
	metricsListen   string
	store           storeFlags
	scopeHeader     string
	routes          string
	config          string
	ambiguous       string
	upstreamTimeout time.Duration
	dialTimeout     time.Duration
	lease           time.Duration
	maxExecution    time.Duration
	retention       time.Duration
	maxBody         int64
	wait            time.Duration
	shutdownTimeout time.Duration
	adminToken      string
	adminLogKeys    bool
}

func init() {
	register("proxy", &command{
		synopsis: "an idempotency gateway in front of any HTTP service",
		help:     proxyHelp,
		flags: func(fs *flag.FlagSet) func(*env) int {
			p := newProxyFlags(fs)
			return func(e *env) int {
				if err := p.run(e); err != nil {
					return fail(e, "proxy", err)
				}
				return exitOK
			}
		},
	})
}

// newProxyFlags declares idem proxy's flags on fs.
func newProxyFlags(fs *flag.FlagSet) *proxyFlags {
	p := &proxyFlags{fs: fs, store: storeFlags{name: "store"}}
	fs.StringVar(&p.upstream, "upstream", "", "the service's base `URL`, e.g. http://127.0.0.1:8080 (required)")
	fs.StringVar(&p.listen, "listen", "127.0.0.1:8081", "the `address` to listen on")
	fs.StringVar(&p.metricsListen, "metrics-listen", "", "an `address` of its own for GET /metrics (Prometheus), e.g. 127.0.0.1:9091; empty: no metrics")
	fs.StringVar(&p.store.raw, "store", "sqlite:idem-proxy.db", "where the records live: a `DSN` (see above)")
	fs.StringVar(&p.store.cache, "cache", "", "Redis in front of a SQL -store: redis://host:port/db")
	fs.StringVar(&p.scopeHeader, "scope-header", "", "the request `header` whose value (hashed) scopes the keys, e.g. X-Api-Key")
	fs.StringVar(&p.routes, "routes", "", "the covered routes, comma-separated `'METHOD PATH,…'`; default every POST and PATCH")
	fs.StringVar(&p.config, "config", "", "a JSON `file` of settings named like the flags")
	fs.StringVar(&p.ambiguous, "ambiguous", ambiguousKeep, "when the upstream's outcome is unknown: keep the key until its lease ends, or release it")
	fs.DurationVar(&p.upstreamTimeout, "upstream-timeout", 30*time.Second, "how long to wait for the upstream's answer after sending it the request")
	fs.DurationVar(&p.dialTimeout, "dial-timeout", 5*time.Second, "how long to wait for a connection to the upstream")
	fs.DurationVar(&p.lease, "lease", idem.DefaultLease, "how long a key in flight is held without renewal (renewed every third of it); keep it well above the store's worst round trip under load: a lease whose renewal is not confirmed in time is lost, the upstream call is cut, and another proxy may call the upstream again")
	fs.DurationVar(&p.maxExecution, "max-execution", idem.DefaultMaxExecution, "the longest a guarded request runs, streaming included")
	fs.DurationVar(&p.retention, "retention", idem.DefaultRetention, "how long a stored answer is replayed")
	fs.Int64Var(&p.maxBody, "max-body", idemhttp.DefaultMaxRequestBody, "the largest request body of a covered route, in `bytes` (and the largest answer kept for replay)")
	fs.DurationVar(&p.wait, "wait", 0, "how long a retry that arrives while its key is in flight waits for the answer to replay; 0 answers it 409 at once")
	fs.DurationVar(&p.shutdownTimeout, "shutdown-timeout", 30*time.Second, "how long a stop waits for the requests in flight")
	fs.StringVar(&p.adminToken, "admin-token", "", "serve the operator page at /admin/ behind this token (at least 16 bytes; default $"+adminTokenEnv+"); "+
		"without one, /admin/ goes to the upstream like any path")
	fs.BoolVar(&p.adminLogKeys, "admin-log-keys", false, "log the raw idempotency key of the operator page's evictions (default: its hash only)")
	return p
}

// applyConfig fills the flags not given on the command line from the
// JSON file of -config.
func (p *proxyFlags) applyConfig() error {
	if p.config == "" {
		return nil
	}
	set := map[string]bool{}
	p.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	raw, err := os.ReadFile(p.config)
	if err != nil {
		return usagef("-config: %v", err)
	}
	var settings map[string]any
	if err := json.Unmarshal(raw, &settings); err != nil {
		return usagef("-config %s: not a JSON object of settings: %v", p.config, err)
	}
	names := make([]string, 0, len(settings))
	for name := range settings {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if name == "config" || p.fs.Lookup(name) == nil {
			return usagef("-config %s: unknown setting %q (settings are named like idem proxy's flags; see 'idem help proxy')", p.config, name)
		}
		if set[name] {
			continue
		}
		var value string
		switch v := settings[name].(type) {
		case string:
			value = v
		case float64, bool:
			value = fmt.Sprint(v)
		case []any:
			if len(v) == 0 {
				// An empty list would read as the flag left out (for
				// routes: every POST and PATCH), the opposite of what
				// it says.
				return usagef("-config %s: %q is an empty list; name at least one, or leave the setting out for its default", p.config, name)
			}
			parts := make([]string, len(v))
			for i, item := range v {
				s, ok := item.(string)
				if !ok {
					return usagef("-config %s: %q: a list of strings, not %v", p.config, name, item)
				}
				parts[i] = s
			}
			value = strings.Join(parts, ",")
		default:
			return usagef("-config %s: %q: want a string, a number, a boolean or a list of strings", p.config, name)
		}
		if err := p.fs.Set(name, value); err != nil {
			return usagef("-config %s: %q: %v", p.config, name, err)
		}
	}
	return nil
}

// route is one covered route: a method and a path pattern, and the
// pattern cleaned and in lower case, which other spellings of the path
// are matched against.
type route struct {
	method, pattern, folded string
}

// parseRoutes parses -routes.
func parseRoutes(raw string) ([]route, error) {
	var routes []route
	for item := range strings.SplitSeq(raw, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		method, pattern, ok := strings.Cut(item, " ")
		pattern = strings.TrimSpace(pattern)
		if !ok || pattern == "" {
			return nil, usagef("-routes: %q is not METHOD PATH, e.g. 'POST /orders'", item)
		}
		if !validHeaderName(method) {
			return nil, usagef("-routes: %q: %q is not a method (letters, digits and !#$%%&'*+-.^_`|~)", item, method)
		}
		if method != strings.ToUpper(method) {
			return nil, usagef("-routes: %q: methods are case-sensitive, write %s", item, strings.ToUpper(method))
		}
		if !strings.HasPrefix(pattern, "/") {
			return nil, usagef("-routes: %q: the path must start with /", item)
		}
		if _, err := path.Match(pattern, "/"); err != nil {
			return nil, usagef("-routes: %q: bad pattern: %v", item, err)
		}
		routes = append(routes, route{method: method, pattern: pattern, folded: foldPath(pattern)})
	}
	if len(routes) == 0 {
		return nil, usagef("-routes names no route: give 'METHOD PATH,…', e.g. 'POST /orders', or leave it out to cover every POST and PATCH")
	}
	return routes, nil
}

// check validates the settings; its errors name the flag and the fix.
func (p *proxyFlags) check() (*url.URL, []route, error) {
	if p.upstream == "" {
		return nil, nil, usagef("-upstream is required: the base URL of the service to put idem in front of, e.g. -upstream http://127.0.0.1:8080")
	}
	u, err := url.Parse(p.upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, nil, usagef("-upstream %q: want an http:// or https:// URL with a host, e.g. http://127.0.0.1:8080", p.upstream)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, nil, usagef("-upstream %q: a base URL has no query or fragment", p.upstream)
	}
	var routes []route
	if p.routes != "" {
		if routes, err = parseRoutes(p.routes); err != nil {
			return nil, nil, err
		}
	}
	if p.scopeHeader != "" && !validHeaderName(p.scopeHeader) {
		return nil, nil, usagef("-scope-header %q is not a header name, e.g. X-Api-Key", p.scopeHeader)
	}
	switch p.ambiguous {
	case ambiguousKeep, ambiguousRelease:
	default:
		return nil, nil, usagef("-ambiguous %q: want keep or release", p.ambiguous)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"upstream-timeout", p.upstreamTimeout}, {"dial-timeout", p.dialTimeout}, {"lease", p.lease},
		{"max-execution", p.maxExecution}, {"retention", p.retention}, {"shutdown-timeout", p.shutdownTimeout}} {
		if d.v <= 0 {
			return nil, nil, usagef("-%s must be positive, e.g. -%s 30s", d.name, d.name)
		}
	}
	if p.lease < 3*time.Millisecond {
		return nil, nil, usagef("-lease %v is too short: give at least a few milliseconds (renewals run every third of it)", p.lease)
	}
	if p.maxExecution < p.upstreamTimeout {
		return nil, nil, usagef("-max-execution (%v) must be at least -upstream-timeout (%v): a guarded request ends at -max-execution", p.maxExecution, p.upstreamTimeout)
	}
	if p.wait < 0 {
		return nil, nil, usagef("-wait must not be negative (0 answers a retry in flight 409 at once)")
	}
	if p.maxBody <= 0 {
		return nil, nil, usagef("-max-body must be positive, e.g. -max-body 1048576")
	}
	if _, _, _, err := p.store.parse(); err != nil {
		return nil, nil, err
	}
	if p.adminToken == "" {
		p.adminToken = os.Getenv(adminTokenEnv)
	}
	if p.adminToken != "" && len(p.adminToken) < admin.MinTokenLen {
		return nil, nil, usagef("the operator page's token (-admin-token or $%s) must be at least %d bytes", adminTokenEnv, admin.MinTokenLen)
	}
	if err := tracing.CheckEnv(); err != nil {
		return nil, nil, usagef("OpenTelemetry export: %v", err)
	}
	return u, routes, nil
}

func (p *proxyFlags) run(e *env) error {
	if len(e.args) > 0 {
		return usagef("unexpected argument %q: idem proxy takes flags only (-upstream URL)", e.args[0])
	}
	if err := p.applyConfig(); err != nil {
		return err
	}
	upstream, routes, err := p.check()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

	// Listen (and on the metrics address) before touching the store: an
	// address in use ends the proxy with no database created.
	ln, err := net.Listen("tcp", p.listen)
	if err != nil {
		return fmt.Errorf("-listen %s: %w (give a free address, e.g. -listen 127.0.0.1:8082)", p.listen, err)
	}
	defer ln.Close()
	var mln net.Listener
	if p.metricsListen != "" {
		if mln, err = net.Listen("tcp", p.metricsListen); err != nil {
			return fmt.Errorf("-metrics-listen %s: %w (give a free address, e.g. -metrics-listen 127.0.0.1:9091)", p.metricsListen, err)
		}
		defer mln.Close()
	}

	st, err := p.store.open(e.ctx, openOptions{migrate: true, log: log})
	if err != nil {
		if e.ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer st.Close()

	// Spans go to the OTLP endpoint when OTEL_EXPORTER_OTLP_ENDPOINT is
	// set; they are flushed after the server drained.
	traces, err := tracing.Start(e.ctx, "idem-proxy")
	if err != nil {
		return fmt.Errorf("OpenTelemetry export: %w", err)
	}
	defer func() {
		tctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := traces.Shutdown(tctx); err != nil {
			log.Warn("idem proxy: OpenTelemetry export: spans lost at shutdown", "error", err)
		}
	}()

	// The metrics (-metrics-listen), the operator page's live counters
	// and the spans hear the same decisions.
	counters := &admin.Counters{}
	obs := idem.Observers(counters, traces.Observer())
	metricsAt := "none (-metrics-listen)"
	if p.metricsListen != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		prom, err := idemprom.New(reg, nil)
		if err != nil {
			return err
		}
		obs = idem.Observers(prom, obs)
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		msrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = msrv.Serve(mln) }()
		defer msrv.Close()
		metricsAt = "http://" + mln.Addr().String() + "/metrics"
	}

	h, err := newProxy(p, upstream, routes, st.store, st.kind, obs, log)
	if err != nil {
		return err
	}
	defer h.transport.CloseIdleConnections()

	var handler http.Handler = h
	if p.adminToken != "" {
		// The operator page takes /admin/ from the upstream.
		cfg := &admin.Config{Token: p.adminToken, Name: "idem proxy", Logger: log, LogKeys: p.adminLogKeys,
			Counters: counters, Store: st.store, RecordsNote: "the Redis store cannot list its records"}
		if st.sql != nil {
			cfg.Records = st.sql
		}
		page, err := admin.New(cfg)
		if err != nil {
			return err
		}
		// Not a ServeMux: it would answer the paths that are not clean
		// (doubled slashes, dot segments) with a redirect of its own,
		// where the upstream gets them when the page is off.
		handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasPrefix(r.URL.Path, "/admin/") {
				page.ServeHTTP(w, r)
				return
			}
			h.ServeHTTP(w, r)
		})
	}
	srv := &http.Server{
		Handler:           traces.Handler(handler),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(e.ctx) },
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	covered := "every POST and PATCH"
	if p.routes != "" {
		covered = p.routes
	}
	scope := "none: one key space for every caller"
	if p.scopeHeader != "" {
		scope = p.scopeHeader + " (hashed)"
	}
	fmt.Fprintf(e.stdout, "idem proxy listening on http://%s\nupstream: %s\nstore: %s\ncovered: %s\nscope: %s\nmetrics: %s\n",
		ln.Addr(), upstream.Redacted(), st.display, covered, scope, metricsAt)
	if p.adminToken != "" {
		fmt.Fprintf(e.stdout, "operator page: http://%s/admin/\n", ln.Addr())
	}

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-e.ctx.Done():
	}
	log.Info("idem proxy: stopping; waiting for the requests in flight")
	sctx, cancel := context.WithTimeout(context.Background(), p.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
		return fmt.Errorf("stop: requests still in flight after -shutdown-timeout %v were cut: %w", p.shutdownTimeout, err)
	}
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	log.Info("idem proxy: stopped")
	return nil
}

// adminTokenEnv is the environment variable of the operator page's
// token, read when -admin-token is not given.
const adminTokenEnv = "IDEM_ADMIN_TOKEN"

// proxy is idem proxy's handler: the covered routes through the
// middleware to the reverse proxy, the others straight to it.
type proxy struct {
	routes    []route // nil: every POST and PATCH
	guarded   http.Handler
	plain     http.Handler
	transport *http.Transport
	keep      bool // -ambiguous keep
	log       *slog.Logger
	logKeys   bool // log lines carry the raw scope and key beside the hash (the middleware's LogKeys too); no flag sets it
}

// newProxy builds the handler of idem proxy.
func newProxy(p *proxyFlags, upstream *url.URL, routes []route, store idem.Store, storeName string, obs idem.Observer, log *slog.Logger) (*proxy, error) {
	dialer := &net.Dialer{Timeout: p.dialTimeout, KeepAlive: 30 * time.Second}
	transport := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   p.dialTimeout,
		ExpectContinueTimeout: time.Second,
		// The wait for the answer after the request was sent: past it the
		// outcome is unknown.
		ResponseHeaderTimeout: p.upstreamTimeout,
	}
	px := &proxy{routes: routes, transport: transport, keep: p.ambiguous == ambiguousKeep, log: log}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.SetXForwarded()
		},
		// The upstream sees its own host (SetURL), so an absolute
		// Location it builds names the upstream, which the client cannot
		// or must not reach directly: it becomes the same path on the
		// proxy, before the answer is stored.
		ModifyResponse: func(resp *http.Response) error {
			rewriteLocation(resp.Header, upstream)
			return nil
		},
		Transport:    transport,
		ErrorHandler: px.upstreamError,
		ErrorLog:     slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	px.plain = rp

	var methods []string
	for _, r := range routes {
		if !slices.Contains(methods, r.method) {
			methods = append(methods, r.method)
		}
	}
	cfg := &idemhttp.Config{
		Store:           store,
		Methods:         methods,
		Lease:           p.lease,
		MaxExecution:    p.maxExecution,
		Retention:       p.retention,
		MaxRequestBody:  p.maxBody,
		MaxResponseBody: p.maxBody,
		Wait:            p.wait,
		Logger:          log,
		Observer:        obs,
		StoreName:       storeName,
		Route:           px.route,
		LogKeys:         px.logKeys,
	}
	if name := p.scopeHeader; name != "" {
		cfg.Scope = func(r *http.Request) (string, error) {
			values := r.Header.Values(name)
			if len(values) == 0 || strings.Join(values, ",") == "" {
				return "", &idemhttp.ScopeError{Detail: "this request needs a " + name + " header: it identifies the caller whose keys these are"}
			}
			return hashScope(strings.Join(values, ",")), nil
		}
	}
	mw, err := idemhttp.New(cfg)
	if err != nil {
		return nil, usagef("%v", err)
	}
	px.guarded = mw.Handler(http.HandlerFunc(px.forward))
	return px, nil
}

func (px *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if px.covers(r) {
		if upgrade := upgradeRequested(r.Header); upgrade != "" {
			idemhttp.WriteProblem(w, http.StatusBadRequest, codeUpgradeOnCoveredRoute, "Upgrade on a covered route",
				"this route needs an Idempotency-Key, and an upgraded connection ("+strconv.Quote(upgrade)+") has no answer to store and replay: "+
					"send the request without Connection: Upgrade, or leave the route out of idem proxy's -routes")
			return
		}
		// A guarded request outlives its client: once the upstream has
		// the request, a client that goes away must not cut the call
		// (its effect may be done, and a cut call is an unknown outcome
		// whose retry reaches the upstream again once the lease ends).
		// The upstream's answer is read to its end and stored, and the
		// retry replays it. -upstream-timeout and -max-execution still
		// bound the call.
		px.guarded.ServeHTTP(w, r.WithContext(context.WithoutCancel(r.Context())))
		return
	}
	px.plain.ServeHTTP(w, r)
}

// rewriteLocation turns a Location header that points at the upstream
// (its scheme and host, under its base path) into the same path-absolute
// reference on the proxy, as nginx's proxy_redirect default does. Other
// Locations are left as they are.
func rewriteLocation(h http.Header, upstream *url.URL) {
	values := h["Location"]
	if len(values) != 1 {
		return
	}
	u, err := url.Parse(values[0])
	if err != nil || u.Host == "" || u.User != nil || (u.Scheme != "" && !strings.EqualFold(u.Scheme, upstream.Scheme)) {
		return
	}
	if !sameHost(u.Host, upstream.Host, upstream.Scheme) {
		return
	}
	p := u.EscapedPath()
	if base := strings.TrimSuffix(upstream.EscapedPath(), "/"); base != "" {
		switch {
		case p == base:
			p = "/"
		case strings.HasPrefix(p, base+"/"):
			p = p[len(base):]
		default:
			return // on the upstream, outside what the proxy forwards to
		}
	}
	if p == "" {
		p = "/"
	}
	if strings.HasPrefix(p, "//") {
		return // would read as a host
	}
	if u.RawQuery != "" || u.ForceQuery {
		p += "?" + u.RawQuery
	}
	if u.Fragment != "" {
		p += "#" + u.EscapedFragment()
	}
	h["Location"] = []string{p}
}

// sameHost reports whether the hosts a and b (host or host:port) are one,
// a missing port being scheme's default.
func sameHost(a, b, scheme string) bool {
	port := "80"
	if strings.EqualFold(scheme, "https") {
		port = "443"
	}
	split := func(hp string) (string, string) {
		if h, p, err := net.SplitHostPort(hp); err == nil {
			return h, p
		}
		return strings.Trim(hp, "[]"), port
	}
	ah, ap := split(a)
	bh, bp := split(b)
	return strings.EqualFold(ah, bh) && ap == bp
}

// upgradeRequested returns the protocol a request asks to upgrade to (its
// Upgrade header, when Connection lists upgrade, as the reverse proxy
// reads it), or "".
func upgradeRequested(h http.Header) string {
	for _, v := range h["Connection"] {
		for token := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(token), "upgrade") {
				return h.Get("Upgrade")
			}
		}
	}
	return ""
}

// covers reports whether r's route is covered.
func (px *proxy) covers(r *http.Request) bool { return px.route(r) != "" }

// route returns the covered route r matches, as its metrics and spans
// name it (a bounded label: the -routes entry "POST /orders/*", or the
// method alone when every POST and PATCH is covered), or "" when r is not
// covered.
func (px *proxy) route(r *http.Request) string {
	if px.routes == nil {
		if r.Method == http.MethodPost || r.Method == http.MethodPatch {
			return r.Method
		}
		return ""
	}
	folded := foldPath(r.URL.Path)
	for _, rt := range px.routes {
		if rt.method != r.Method {
			continue
		}
		if ok, _ := path.Match(rt.pattern, r.URL.Path); ok {
			return rt.method + " " + rt.pattern
		}
		if ok, _ := path.Match(rt.folded, folded); ok {
			return rt.method + " " + rt.pattern
		}
	}
	return ""
}

// foldPath returns p cleaned (no trailing or doubled slash, no dot
// segment) and in lower case: the spellings of a path that many upstreams
// route to one handler (a trailing slash appended, case-insensitive
// routing) are covered as the route is, since passing them unguarded
// would run a keyed request's retries again.
func foldPath(p string) string {
	return strings.ToLower(path.Clean("/" + p))
}

// sentKey is the context key of a guarded request's sent flag.
type sentKey struct{}

// forward sends a guarded request upstream, noting in its context when
// the request starts to reach the upstream: an error after that leaves
// the outcome unknown.
func (px *proxy) forward(w http.ResponseWriter, r *http.Request) {
	sent := new(atomic.Bool)
	ctx := context.WithValue(r.Context(), sentKey{}, sent)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteHeaderField: func(string, []string) { sent.Store(true) },
		WroteHeaders:     func() { sent.Store(true) },
	})
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				px.brokeOff(ctx, r)
			}
			panic(v) // the client's connection is cut: the answer is incomplete
		}
	}()
	out := r.WithContext(ctx)
	if r.ContentLength != 0 {
		// The transport may go on reading the request body after the round
		// trip has ended (net/http.RoundTripper), and the middleware's body
		// reads a buffer it reuses once the handler returns: the upstream
		// gets a copy of its own.
		body, err := io.ReadAll(r.Body)
		if err != nil {
			idemhttp.WriteProblem(w, http.StatusBadRequest, idemhttp.CodeInvalidRequest, "Invalid request", "the request body cannot be read")
			return
		}
		out.Body = io.NopCloser(bytes.NewReader(body))
	}
	px.plain.ServeHTTP(&clientWriter{ResponseWriter: w, px: px, ctx: ctx}, out)
}

// brokeOff ends the execution of a guarded request whose answer broke off
// while it was copied (the upstream's connection broke, or the request
// reached -max-execution): the upstream answered, so its effect probably
// happened, and the outcome is unknown, handled as -ambiguous says. The
// reverse proxy then aborts the client's connection.
func (px *proxy) brokeOff(ctx context.Context, r *http.Request) {
	exec := idemhttp.ExecutionFrom(ctx)
	if exec == nil {
		return
	}
	l := exec.Lease()
	if errors.Is(context.Cause(ctx), idem.ErrLeaseLost) {
		px.log.WarnContext(ctx, "idem proxy: answer cut: the key's lease was lost", "path", r.URL.Path, idem.LogKey(l.Scope, l.Key, px.logKeys))
		return
	}
	px.log.WarnContext(ctx, "idem proxy: the upstream's answer broke off; outcome unknown",
		"path", r.URL.Path, idem.LogKey(l.Scope, l.Key, px.logKeys), "ambiguous", map[bool]string{true: ambiguousKeep, false: ambiguousRelease}[px.keep],
		"cause", context.Cause(ctx))
	if px.keep {
		exec.Abandon()
		return
	}
	if err := exec.Release(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, idem.ErrLeaseLost) && !errors.Is(err, idem.ErrFinished) {
		exec.Abandon()
		px.log.ErrorContext(ctx, "idem proxy: cannot release the key; left to its lease", "path", r.URL.Path, idem.LogKey(l.Scope, l.Key, px.logKeys), "error", err)
	}
}

// clientWriter is the writer a guarded answer is copied to: the
// middleware's. A write that fails (the client went away in the middle
// of a streamed or large answer) is reported done: the reverse proxy then reads the upstream's
// answer to its end, and the middleware stores it for the retry, where
// it would otherwise abort (http.ErrAbortHandler), and the key would be
// released although the upstream answered.
type clientWriter struct {
	http.ResponseWriter
	px   *proxy
	ctx  context.Context
	gone bool
}

func (w *clientWriter) Write(p []byte) (int, error) {
	// The middleware's writer keeps p for the record before it sends it,
	// so every write goes to it, the client gone or not.
	if _, err := w.ResponseWriter.Write(p); err != nil && !w.gone {
		w.gone = true
		w.px.log.InfoContext(w.ctx, "idem proxy: the client went away during the answer; reading it to its end for the retry", "error", err)
	}
	return len(p), nil
}

// Unwrap returns the middleware's writer, for http.ResponseController
// (flushes, and the hijack of a protocol upgrade).
func (w *clientWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// unknownOutcome ends a guarded request's execution as -ambiguous says:
// keep abandons it (the record stays in flight until its lease ends);
// release leaves it to the middleware, which releases on the 502.
func (px *proxy) unknownOutcome(ctx context.Context) {
	if !px.keep {
		return
	}
	if exec := idemhttp.ExecutionFrom(ctx); exec != nil {
		exec.Abandon()
	}
}

// upstreamError answers a request whose upstream call failed. r is the
// outgoing request; its context is the guarded request's.
func (px *proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	ctx := r.Context()
	sent, guarded := ctx.Value(sentKey{}).(*atomic.Bool)
	switch {
	case errors.Is(context.Cause(ctx), idem.ErrLeaseLost):
		// The middleware answers what a retry would get.
		px.log.WarnContext(ctx, "idem proxy: upstream call cut: the key's lease was lost", "path", r.URL.Path, "error", err)
	case guarded && sent.Load():
		px.log.WarnContext(ctx, "idem proxy: the upstream got the request and did not answer; outcome unknown",
			"path", r.URL.Path, "ambiguous", map[bool]string{true: ambiguousKeep, false: ambiguousRelease}[px.keep], "error", err)
		px.unknownOutcome(ctx)
		idemhttp.WriteProblem(w, http.StatusBadGateway, codeUpstreamOutcomeUnknown, "Upstream outcome unknown",
			"the service got the request and did not answer; whether it took effect is unknown. "+
				"Retry with the same Idempotency-Key: it is answered 409 until the key's lease ends, then runs again")
		return
	default:
		px.log.WarnContext(ctx, "idem proxy: upstream unavailable", "path", r.URL.Path, "error", err)
	}
	idemhttp.WriteProblem(w, http.StatusBadGateway, codeUpstreamUnavailable, "Upstream unavailable",
		"the service cannot be reached; retry later")
}
