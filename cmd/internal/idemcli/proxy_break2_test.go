package idemcli

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
