package idemcli

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testenv"
)

// startProxy runs idem proxy with args (and -listen 127.0.0.1:0) until
// the test ends, and returns its base URL. The test fails if the proxy
// does not stop cleanly (exit status 0) when asked to.
func startProxy(t *testing.T, args ...string) string {
	t.Helper()
	return startProxyLog(t, &obstest.LogBuffer{}, args...)
}

// startProxyLog is startProxy with the proxy's log (its stderr) written
// to stderr.
func startProxyLog(t *testing.T, stderr *obstest.LogBuffer, args ...string) string {
	t.Helper()
	return startProxyOut(t, &obstest.LogBuffer{}, stderr, args...)
}

// startProxyOut is startProxyLog with the proxy's standard output in
// stdout.
func startProxyOut(t *testing.T, stdout, stderr *obstest.LogBuffer, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, append([]string{"proxy", "-listen", "127.0.0.1:0"}, args...), strings.NewReader(""), stdout, stderr)
	}()
	t.Cleanup(func() {
		cancel()
		if t.Failed() {
			t.Logf("idem proxy's stderr:\n%s", stderr)
		}
		select {
		case code := <-done:
			if code != exitOK {
				t.Errorf("idem proxy exited %d; stderr:\n%s", code, stderr)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("idem proxy did not stop within 30 s")
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if line, ok := strings.CutPrefix(stdout.String(), "idem proxy listening on "); ok {
			if base, _, ok := strings.Cut(line, "\n"); ok {
				return base
			}
		}
		select {
		case code := <-done:
			done <- code
			t.Fatalf("idem proxy exited %d before listening; stderr:\n%s", code, stderr)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("idem proxy does not listen after 30 s; stderr:\n%s", stderr)
		}
	}
}

// upstream is a service behind the proxy that counts the requests it
// gets (its effect), by path.
type upstream struct {
	*httptest.Server
	mu    sync.Mutex
	calls map[string]int
	// handle, if set for a path, answers it (after the call is counted;
	// n is the call's number on that path).
	handle map[string]func(w http.ResponseWriter, r *http.Request, n int)
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{calls: map[string]int{}, handle: map[string]func(http.ResponseWriter, *http.Request, int){}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.calls[r.URL.Path]++
		n := u.calls[r.URL.Path]
		h := u.handle[r.URL.Path]
		u.mu.Unlock()
		if h != nil {
			h(w, r, n)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", r.URL.Path+"/"+fmt.Sprint(n))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"path":%q,"call":%d,"body":%q,"tenant":%q}`, r.URL.Path, n, body, r.Header.Get("X-Api-Key"))
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) on(path string, h func(w http.ResponseWriter, r *http.Request, n int)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.handle[path] = h
}

func (u *upstream) count(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[path]
}

func (u *upstream) wantCalls(t *testing.T, path string, n int) {
	t.Helper()
	if got := u.count(path); got != n {
		t.Fatalf("upstream got %d calls on %s, want %d", got, path, n)
	}
}

// answer is a response read in full.
type answer struct {
	status int
	header http.Header
	body   string
}

func (a answer) replayed() bool { return a.header.Get(idemhttp.HeaderReplayed) == "true" }

// code returns a problem answer's code.
func (a answer) code() string {
	var p struct{ Code string }
	_ = json.Unmarshal([]byte(a.body), &p)
	return p.Code
}

// send sends one request through the proxy; key and header values are
// set when not empty.
func send(t *testing.T, method, url, key, body string, header ...string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: body: %v", method, url, err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// newKey returns an idempotency key no other test run uses.
func newKey(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// proxyBackends are the stores the proxy runs on in the tests; each
// returns the flags that select it.
var proxyBackends = []struct {
	name  string
	flags func(t *testing.T) []string
}{
	{"SQLite", func(t *testing.T) []string {
		return []string{"-store", "sqlite:" + filepath.Join(t.TempDir(), "idem.db")}
	}},
	{"PostgreSQL", func(t *testing.T) []string {
		_, url := testdb.Postgres(t)
		return []string{"-store", url}
	}},
	{"MariaDB", func(t *testing.T) []string {
		_, dsn := testdb.MySQL(t)
		return []string{"-store", "mysql:" + dsn}
	}},
	{"Redis", func(t *testing.T) []string {
		return []string{"-store", "redis://" + testenv.Redis.Need(t) + "/0"}
	}},
	{"RedisOverPostgreSQL", func(t *testing.T) []string {
		_, url := testdb.Postgres(t)
		return []string{"-store", url, "-cache", "redis://" + testenv.Redis.Need(t) + "/0"}
	}},
}

// On every store: 100 concurrent duplicates make one upstream call and
// get 100 identical answers, all but the first marked as replays; an
// upstream 5xx releases the key; an upstream that gets the request and
// does not answer keeps it in flight (409, no second call) until the
// lease ends.
func TestProxyStores(t *testing.T) {
	t.Parallel()
	for _, b := range proxyBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t)
			slowDone := make(chan struct{})
			t.Cleanup(func() { close(slowDone) })
			up.on("/slow", func(w http.ResponseWriter, r *http.Request, n int) {
				if n == 1 {
					select { // past -upstream-timeout
					case <-slowDone:
					case <-r.Context().Done():
					}
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "slow call %d", n)
			})
			up.on("/flaky", func(w http.ResponseWriter, r *http.Request, n int) {
				if n == 1 {
					http.Error(w, "try again", http.StatusServiceUnavailable)
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "flaky call %d", n)
			})
			flags := b.flags(t)
			// Duplicates wait for the first request's answer.
			base := startProxy(t, append(flags, "-upstream", up.URL, "-wait", "20s")...)
			// Retries are answered 409 at once while the key is in flight.
			noWait := startProxy(t, append(flags, "-upstream", up.URL, "-upstream-timeout", "300ms", "-lease", "2s")...)

			// 100 concurrent duplicates.
			key := newKey("dup")
			const n = 100
			answers := make([]answer, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() { answers[i] = send(t, http.MethodPost, base+"/orders", key, `{"sku":"A-1","qty":2}`) })
			}
			wg.Wait()
			up.wantCalls(t, "/orders", 1)
			replays := 0
			for i, a := range answers {
				if a.status != http.StatusCreated || a.body != answers[0].body || a.header.Get("Location") != "/orders/1" {
					t.Fatalf("answer %d: %d %v %s; want the first call's 201 (%s)", i, a.status, a.header, a.body, answers[0].body)
				}
				if a.replayed() {
					replays++
				}
			}
			if replays != n-1 {
				t.Fatalf("%d answers marked replayed, want %d", replays, n-1)
			}

			// 5xx releases: the retry reaches the upstream.
			key = newKey("flaky")
			if a := send(t, http.MethodPost, base+"/flaky", key, `{}`); a.status != http.StatusServiceUnavailable {
				t.Fatalf("first: %d %s", a.status, a.body)
			}
			if a := send(t, http.MethodPost, base+"/flaky", key, `{}`); a.status != http.StatusCreated || a.body != "flaky call 2" || a.replayed() {
				t.Fatalf("retry after a 503: %d %s", a.status, a.body)
			}
			up.wantCalls(t, "/flaky", 2)

			// The upstream times out: the key is kept until its lease ends.
			key = newKey("slow")
			a := send(t, http.MethodPost, noWait+"/slow", key, `{}`)
			if a.status != http.StatusBadGateway || a.code() != codeUpstreamOutcomeUnknown {
				t.Fatalf("timed out: %d %s; want 502 %s", a.status, a.body, codeUpstreamOutcomeUnknown)
			}
			if a := send(t, http.MethodPost, noWait+"/slow", key, `{}`); a.status != http.StatusConflict || a.code() != idemhttp.CodeProcessing {
				t.Fatalf("retry within the lease: %d %s; want 409 PROCESSING", a.status, a.body)
			}
			up.wantCalls(t, "/slow", 1)
			// After the lease, a retry runs again.
			deadline := time.Now().Add(15 * time.Second)
			for {
				a := send(t, http.MethodPost, noWait+"/slow", key, `{}`)
				if a.status == http.StatusCreated {
					if a.body != "slow call 2" {
						t.Fatalf("retry after the lease: %s", a.body)
					}
					break
				}
				if a.status != http.StatusConflict || time.Now().After(deadline) {
					t.Fatalf("retry: %d %s; want 409 until the lease ends, then 201", a.status, a.body)
				}
				time.Sleep(50 * time.Millisecond)
			}
			up.wantCalls(t, "/slow", 2)
		})
	}
}

// -ambiguous keep (the default) answers a retry within the lease 409
// without reaching the upstream; -ambiguous release lets it through.
func TestProxyAmbiguous(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{ambiguousKeep, ambiguousRelease} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t)
			slowDone := make(chan struct{})
			t.Cleanup(func() { close(slowDone) })
			up.on("/pay", func(w http.ResponseWriter, r *http.Request, n int) {
				if n == 1 {
					select {
					case <-slowDone:
					case <-r.Context().Done():
					}
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "paid by call %d", n)
			})
			base := startProxy(t, "-store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), "-upstream", up.URL,
				"-upstream-timeout", "200ms", "-lease", "1m", "-ambiguous", policy)
			key := newKey("pay")
			a := send(t, http.MethodPost, base+"/pay", key, `{"amount":5}`)
			if a.status != http.StatusBadGateway || a.code() != codeUpstreamOutcomeUnknown {
				t.Fatalf("timed out: %d %s", a.status, a.body)
			}
			up.wantCalls(t, "/pay", 1)
			retry := send(t, http.MethodPost, base+"/pay", key, `{"amount":5}`)
			switch policy {
			case ambiguousKeep:
				if retry.status != http.StatusConflict || retry.code() != idemhttp.CodeProcessing {
					t.Fatalf("retry: %d %s; want 409 PROCESSING", retry.status, retry.body)
				}
				up.wantCalls(t, "/pay", 1)
			case ambiguousRelease:
				if retry.status != http.StatusCreated || retry.body != "paid by call 2" {
					t.Fatalf("retry: %d %s; want the upstream's 201", retry.status, retry.body)
				}
				up.wantCalls(t, "/pay", 2)
			}
		})
	}
}

// An upstream that refuses connections: 502 UPSTREAM_UNAVAILABLE and the
// key released, so the retry reaches the upstream once it is up.
func TestProxyConnectionRefusedReleases(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	base := startProxy(t, "-store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), "-upstream", "http://"+addr)
	key := newKey("refused")
	a := send(t, http.MethodPost, base+"/orders", key, `{}`)
	if a.status != http.StatusBadGateway || a.code() != codeUpstreamUnavailable {
		t.Fatalf("refused: %d %s; want 502 %s", a.status, a.body, codeUpstreamUnavailable)
	}

	up := newUpstream(t)
	up.Close()
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the port was taken in between: %v", err)
	}
	srv := &http.Server{Handler: up.Config.Handler}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	a = send(t, http.MethodPost, base+"/orders", key, `{}`)
	if a.status != http.StatusCreated || a.replayed() {
		t.Fatalf("retry: %d %s; want the upstream's 201", a.status, a.body)
	}
	up.wantCalls(t, "/orders", 1)
}

// A streamed answer (chunked, and server-sent events) reaches the client
// as the upstream flushes it, and is replayed in full.
func TestProxyStreams(t *testing.T) {
	t.Parallel()
	for _, contentType := range []string{"text/plain", "text/event-stream"} {
		t.Run(contentType, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t)
			release := make(chan struct{})
			up.on("/stream", func(w http.ResponseWriter, r *http.Request, n int) {
				w.Header().Set("Content-Type", contentType)
				fmt.Fprint(w, "data: first\n\n")
				w.(http.Flusher).Flush()
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
				fmt.Fprint(w, "data: second\n\n")
			})
			base := startProxy(t, "-store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), "-upstream", up.URL)
			key := newKey("stream")
			req, _ := http.NewRequest(http.MethodPost, base+"/stream", strings.NewReader(`{}`))
			req.Header.Set("Idempotency-Key", key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				close(release)
				t.Fatal(err)
			}
			defer resp.Body.Close()
			first := make(chan string, 1)
			rd := bufio.NewReader(resp.Body)
			go func() {
				line, _ := rd.ReadString('\n')
				first <- line
			}()
			select {
			case line := <-first:
				if line != "data: first\n" {
					close(release)
					t.Fatalf("first chunk %q", line)
				}
			case <-time.After(20 * time.Second):
				close(release)
				t.Fatal("the first chunk did not arrive while the upstream was still answering")
			}
			close(release)
			rest, err := io.ReadAll(rd)
			if err != nil || string(rest) != "\ndata: second\n\n" {
				t.Fatalf("rest %q, %v", rest, err)
			}
			a := send(t, http.MethodPost, base+"/stream", key, `{}`)
			if a.status != http.StatusOK || !a.replayed() || a.body != "data: first\n\ndata: second\n\n" ||
				a.header.Get("Content-Type") != contentType {
				t.Fatalf("replay: %d %v %q", a.status, a.header, a.body)
			}
			up.wantCalls(t, "/stream", 1)
		})
	}
}

// -scope-header: equal keys of different tenants never meet; the header's
// value is stored hashed; a covered request without it is refused.
func TestProxyScopeHeader(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	dbPath := filepath.Join(t.TempDir(), "idem.db")
	base := startProxy(t, "-store", "sqlite:"+dbPath, "-upstream", up.URL, "-scope-header", "X-Api-Key")
	key := newKey("tenant")
	a1 := send(t, http.MethodPost, base+"/orders", key, `{}`, "X-Api-Key", "secret-tenant-a")
	b1 := send(t, http.MethodPost, base+"/orders", key, `{}`, "X-Api-Key", "secret-tenant-b")
	a2 := send(t, http.MethodPost, base+"/orders", key, `{}`, "X-Api-Key", "secret-tenant-a")
	if a1.status != 201 || b1.status != 201 || a1.body == b1.body || a1.replayed() || b1.replayed() {
		t.Fatalf("tenant a %d %s, tenant b %d %s: want two executions", a1.status, a1.body, b1.status, b1.body)
	}
	if !a2.replayed() || a2.body != a1.body || !strings.Contains(a2.body, "secret-tenant-a") {
		t.Fatalf("tenant a's retry: %v %s; want a's answer replayed", a2.header, a2.body)
	}
	up.wantCalls(t, "/orders", 2)
	none := send(t, http.MethodPost, base+"/orders", key, `{}`)
	if none.status != http.StatusUnauthorized {
		t.Fatalf("without the header: %d %s; want 401", none.status, none.body)
	}
	up.wantCalls(t, "/orders", 2)

	// The record's scope is the hash of the header's value.
	st, err := storeFlags{name: "db", raw: "sqlite:" + dbPath}.open(context.Background(), openOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.store.Get(context.Background(), hashScope("secret-tenant-a"), key); err != nil {
		t.Fatalf("tenant a's record under the hashed scope: %v", err)
	}
	if _, err := st.store.Get(context.Background(), "secret-tenant-a", key); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("a record under the raw header value: %v; want ErrNotFound", err)
	}
}

// -routes: only the routes named are guarded; the others pass straight
// through (no key needed, every request reaches the upstream).
func TestProxyRoutes(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	cfg := filepath.Join(t.TempDir(), "proxy.json")
	if err := os.WriteFile(cfg, []byte(`{"routes": ["POST /orders", "PATCH /orders/*"], "lease": "10s"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	base := startProxy(t, "-store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), "-upstream", up.URL, "-config", cfg)

	if a := send(t, http.MethodPost, base+"/orders", "", `{}`); a.status != http.StatusBadRequest || a.code() != idemhttp.CodeMissingKey {
		t.Fatalf("covered without a key: %d %s", a.status, a.body)
	}
	up.wantCalls(t, "/orders", 0)
	key := newKey("patch")
	for range 2 {
		if a := send(t, http.MethodPatch, base+"/orders/7", key, `{"qty":1}`); a.status != http.StatusCreated {
			t.Fatalf("PATCH /orders/7: %d %s", a.status, a.body)
		}
	}
	up.wantCalls(t, "/orders/7", 1)
	// Not covered: every request reaches the upstream, a key or not.
	for _, c := range []struct{ method, path string }{
		{http.MethodPost, "/payments"}, {http.MethodPatch, "/orders/7/items"}, {http.MethodPut, "/orders"}, {http.MethodGet, "/orders"},
	} {
		for range 2 {
			if a := send(t, c.method, base+c.path, key, `{}`); a.status != http.StatusCreated || a.replayed() {
				t.Fatalf("%s %s: %d %s", c.method, c.path, a.status, a.body)
			}
		}
	}
	up.wantCalls(t, "/payments", 2)
	up.wantCalls(t, "/orders/7/items", 2)
	up.wantCalls(t, "/orders", 4)
}

// Bad flags and settings: exit status 2, and the message names the flag.
func TestProxyRejectsBadFlags(t *testing.T) {
	t.Parallel()
	cfg := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(cfg, []byte(`{"upstreams": "http://x"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	noRoutes := filepath.Join(t.TempDir(), "no-routes.json")
	if err := os.WriteFile(noRoutes, []byte(`{"routes": []}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{}, "-upstream is required"},
		{[]string{"-upstream", "http://x", "-config", noRoutes}, `"routes" is an empty list`},
		{[]string{"-upstream", "ftp://x"}, "-upstream"},
		{[]string{"-upstream", "http://x", "-routes", "POST"}, "-routes"},
		{[]string{"-upstream", "http://x", "-routes", "post /x"}, "-routes"},
		{[]string{"-upstream", "http://x", "-ambiguous", "maybe"}, "-ambiguous"},
		{[]string{"-upstream", "http://x", "-lease", "0s"}, "-lease"},
		{[]string{"-upstream", "http://x", "-scope-header", "X Key"}, "-scope-header"},
		{[]string{"-upstream", "http://x", "-store", "sqlite:"}, "-store"},
		{[]string{"-upstream", "http://x", "-store", "redis://127.0.0.1:6379/0", "-cache", "redis://127.0.0.1:6379/1"}, "-cache"},
		{[]string{"-upstream", "http://x", "-config", cfg}, `"upstreams"`},
		{[]string{"-upstream", "http://x", "extra"}, "unexpected argument"},
	} {
		var stderr bytes.Buffer
		code := Main(context.Background(), append([]string{"proxy"}, c.args...), strings.NewReader(""), io.Discard, &stderr)
		if code != exitUsage || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("idem proxy %q: exit %d, %q; want exit 2 naming %s", c.args, code, stderr.String(), c.want)
		}
	}
}

// A malformed OTLP endpoint is a configuration error: exit status 2, a
// message that names the variable, and no database created.
func TestProxyBadOTLPEndpointExits2(t *testing.T) {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
			t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
			t.Setenv(name, "collector:4318")
			db := filepath.Join(t.TempDir(), "p.db")
			var stderr bytes.Buffer
			code := Main(t.Context(), []string{"proxy", "-listen", "127.0.0.1:0", "-upstream", "http://127.0.0.1:1", "-store", "sqlite:" + db},
				strings.NewReader(""), io.Discard, &stderr)
			if code != exitUsage || !strings.Contains(stderr.String(), name) {
				t.Errorf("exit %d, %q; want exit 2 naming %s", code, stderr.String(), name)
			}
			if _, err := os.Stat(db); !os.IsNotExist(err) {
				t.Errorf("the database was created before the endpoint was checked (stat: %v)", err)
			}
		})
	}
}
