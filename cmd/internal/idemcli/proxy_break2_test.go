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
