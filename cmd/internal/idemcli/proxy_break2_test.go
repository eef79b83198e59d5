package idemcli

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/obstest"
)

// rawExchange sends a raw HTTP/1.1 request to base and returns the
// status line and header it gets, and the connection (still open).
func rawExchange(t *testing.T, base, request string) (string, *bufio.Reader, net.Conn) {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte(request)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	var head strings.Builder
	for {
		line, err := br.ReadString('\n')
		head.WriteString(line)
		if err != nil || line == "\r\n" {
			break
		}
	}
	return head.String(), br, conn
}

// A protocol upgrade (WebSocket) on a covered route: the connection
// becomes the upstream's, and no answer exists to store. The retry of an
// upgraded POST was answered 200 Idempotent-Replayed (a status the first
// request never got, from a record completed at the hijack), as if the
// request had been answered. A covered request that asks for an upgrade
// is refused before it reaches the upstream, and leaves no record; an
// uncovered route still upgrades through the proxy.
func TestProxyUpgradeOnCoveredRoute(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	echo := func(w http.ResponseWriter, r *http.Request, n int) {
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "want an upgrade", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		line, _ := brw.ReadString('\n')
		fmt.Fprintf(brw, "echo %s", line)
		brw.Flush()
	}
	up.on("/ws", echo)
	up.on("/open", echo)
	base := startProxy(t, "-upstream", up.URL, "-store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"),
		"-routes", "POST /ws,GET /ws")
	for _, method := range []string{"POST", "GET"} {
		key := newKey("ws")
		req := method + " /ws HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\nIdempotency-Key: " + key + "\r\nContent-Length: 0\r\n\r\n"
		for attempt := range 2 {
			head, _, conn := rawExchange(t, base, req)
			conn.Close()
			if !strings.HasPrefix(head, "HTTP/1.1 400 ") || !strings.Contains(head, "application/problem+json") {
				t.Fatalf("%s /ws with an upgrade, attempt %d: %q; want 400 %s", method, attempt+1, head, codeUpgradeOnCoveredRoute)
			}
		}
		up.wantCalls(t, "/ws", 0)
	}
	a := send(t, "POST", base+"/ws", newKey("ws"), "{}")
	if a.status != http.StatusBadRequest || a.code() != "" || a.replayed() {
		t.Fatalf("POST /ws without an upgrade: %d %s; want the upstream's own 400", a.status, a.body)
	}
	up.wantCalls(t, "/ws", 1)

	// An uncovered route upgrades through the proxy.
	head, br, conn := rawExchange(t, base, "GET /open HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	if !strings.HasPrefix(head, "HTTP/1.1 101 ") {
		t.Fatalf("GET /open with an upgrade: %q; want 101", head)
	}
	fmt.Fprintf(conn, "hello\n")
	if line, err := br.ReadString('\n'); line != "echo hello\n" {
		t.Fatalf("through the upgraded connection: %q, %v", line, err)
	}
}

// The upstream's answer passes the reverse proxy's hop-by-hop filter
// before it is stored: a header the upstream's Connection lists, or
// Keep-Alive, reaches neither the client nor a replay; Set-Cookie reaches
// the first client only (idemhttp's allow-list); an X-Forwarded-For the
// client sent is replaced by the proxy's own. Held: this pins it.
func TestProxyHopByHopAndCookies(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	up.on("/h", func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Set-Cookie", "session=secret")
		w.Header().Set("Connection", "X-Secret, Content-Language")
		w.Header().Set("X-Secret", "s")
		w.Header().Set("Content-Language", "fr")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"n":%d,"xff":%q,"listed":%q}`, n, r.Header.Get("X-Forwarded-For"), r.Header.Get("X-Drop"))
	})
	base := startProxy(t, "-upstream", up.URL, "-store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"))
	key := newKey("h")
	first := send(t, "POST", base+"/h", key, "{}", "X-Forwarded-For", "6.6.6.6", "Connection", "X-Drop", "X-Drop", "d")
	replay := send(t, "POST", base+"/h", key, "{}")
	if first.status != http.StatusCreated || first.header.Get("Set-Cookie") != "session=secret" ||
		first.body != `{"n":1,"xff":"127.0.0.1","listed":""}` {
		t.Fatalf("first: %d %v %s", first.status, first.header, first.body)
	}
	if !replay.replayed() || replay.body != first.body {
		t.Fatalf("retry: %d %v %s; want the first answer replayed", replay.status, replay.header, replay.body)
	}
	for name, a := range map[string]answer{"first": first, "replay": replay} {
		for _, h := range []string{"X-Secret", "Content-Language", "Keep-Alive"} {
			if v := a.header.Values(h); len(v) > 0 {
				t.Errorf("%s answer has hop-by-hop %s: %q", name, h, v)
			}
		}
	}
	if v := replay.header.Values("Set-Cookie"); len(v) > 0 {
		t.Errorf("replay has Set-Cookie %q", v)
	}
	up.wantCalls(t, "/h", 1)
}

// The upstream sees its own host, so a Location it builds from the
// request names the upstream: the client was sent (and every replay
// stored) an address behind the proxy. A Location on the upstream, under
// its base path, becomes the same path on the proxy; others are left.
func TestProxyRewritesLocation(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	locations := map[string]string{}
	for path, loc := range map[string]string{
		"/api/self":      "http://{host}/api/orders/1?x=1#f",
		"/api/bare":      "//{host}/api/orders/2",
		"/api/base":      "http://{host}/api",
		"/api/outside":   "http://{host}/admin/1",
		"/api/elsewhere": "https://example.com/api/orders/3",
		"/api/relative":  "/api/orders/4",
	} {
		locations[path] = loc
		up.on(path, func(w http.ResponseWriter, r *http.Request, n int) {
			w.Header().Set("Location", strings.ReplaceAll(loc, "{host}", r.Host))
			w.WriteHeader(http.StatusCreated)
		})
	}
	host := strings.TrimPrefix(up.URL, "http://")
	base := startProxy(t, "-upstream", up.URL+"/api", "-store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"))
	for path, want := range map[string]string{
		"/api/self":      "/orders/1?x=1#f",
		"/api/bare":      "/orders/2",
		"/api/base":      "/",
		"/api/outside":   "http://" + host + "/admin/1",
		"/api/elsewhere": "https://example.com/api/orders/3",
		"/api/relative":  "/api/orders/4",
	} {
		key := newKey("loc")
		proxyPath := strings.TrimPrefix(path, "/api")
		for _, attempt := range []string{"first", "replay"} {
			a := send(t, "POST", base+proxyPath, key, "{}")
			if a.status != http.StatusCreated || a.header.Get("Location") != want || (attempt == "replay") != a.replayed() {
				t.Errorf("%s %s (upstream's Location %s): %d, Location %q, replayed %v; want %q",
					attempt, proxyPath, locations[path], a.status, a.header.Get("Location"), a.replayed(), want)
			}
		}
		up.wantCalls(t, path, 1)
	}
}

// A stop (SIGINT, SIGTERM) while a guarded request is in flight waits
// for it: the upstream's answer reaches the client and is stored, so the
// retry (to the next proxy on the store) replays it; the proxy exits 0.
// Held.
func TestProxyStopWithRequestInFlight(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	inside := make(chan struct{})
	release := make(chan struct{})
	up.on("/slow", func(w http.ResponseWriter, r *http.Request, n int) {
		close(inside)
		<-release
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d", n)
	})
	store := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout, stderr := &obstest.LogBuffer{}, &obstest.LogBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"proxy", "-listen", "127.0.0.1:0", "-upstream", up.URL, "-store", store}, strings.NewReader(""), stdout, stderr)
	}()
	var base string
	deadline := time.Now().Add(30 * time.Second)
	for base == "" {
		if line, ok := strings.CutPrefix(stdout.String(), "idem proxy listening on "); ok {
			base, _, _ = strings.Cut(line, "\n")
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy does not listen: %s", stderr)
		}
		time.Sleep(5 * time.Millisecond)
	}
	key := newKey("stop")
	got := make(chan answer, 1)
	go func() { got <- send(t, "POST", base+"/slow", key, "{}") }()
	<-inside
	cancel()
	// The proxy waits for the request: it has not exited yet.
	select {
	case code := <-done:
		t.Fatalf("the proxy exited %d with a request in flight", code)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	a := <-got
	if a.status != http.StatusCreated || a.body != "order 1" {
		t.Fatalf("the request in flight at the stop got %d %q; want 201 order 1", a.status, a.body)
	}
	if code := <-done; code != exitOK {
		t.Fatalf("the proxy exited %d: %s", code, stderr)
	}
	base = startProxy(t, "-upstream", up.URL, "-store", store)
	if r := send(t, "POST", base+"/slow", key, "{}"); !r.replayed() || r.body != "order 1" {
		t.Fatalf("the retry after the restart got %d %q replayed %v; want the stored answer", r.status, r.body, r.replayed())
	}
	up.wantCalls(t, "/slow", 1)
}

// A covered route's other spellings: the same path with a trailing
// slash, a doubled slash, a dot segment or other letter case reaches the
// same handler on many upstreams (Express, Django's APPEND_SLASH, ASP.NET
// are case-insensitive), and passed through unguarded: a client that
// sent its key there had its retries run again. They are covered like
// the route; a path that is not the route's still passes.
func TestProxyRouteSpellings(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	base := startProxy(t, "-upstream", up.URL, "-store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"),
		"-routes", "POST /orders,PATCH /orders/*")
	for _, c := range []struct{ method, path string }{
		{"POST", "/orders/"}, {"POST", "//orders"}, {"POST", "/./orders"}, {"POST", "/Orders"},
		{"POST", "/x/../orders"}, {"PATCH", "/orders/7/"}, {"PATCH", "/ORDERS/7"}, {"PATCH", "/orders//7"},
	} {
		if a := send(t, c.method, base+c.path, "", "{}"); a.status != http.StatusBadRequest || a.code() != "MISSING_KEY" {
			t.Errorf("%s %s without a key: %d %s; want 400 MISSING_KEY", c.method, c.path, a.status, a.body)
		}
		key := newKey("spelling")
		first := send(t, c.method, base+c.path, key, "{}")
		again := send(t, c.method, base+c.path, key, "{}")
		if !again.replayed() || again.body != first.body {
			t.Errorf("%s %s retried with its key: %d %s, then %d %s; want the first answer replayed",
				c.method, c.path, first.status, first.body, again.status, again.body)
		}
	}
	for _, p := range []string{"/orders/7", "/orders/7/lines", "/ordersx"} {
		if a := send(t, "POST", base+p, "", "{}"); a.status != http.StatusCreated {
			t.Errorf("POST %s (not covered) without a key: %d %s; want it passed through", p, a.status, a.body)
		}
	}
}
