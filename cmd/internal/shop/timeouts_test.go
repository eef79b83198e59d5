package shop_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// dialShopd opens a raw connection to s, which the test closes.
func dialShopd(t *testing.T, s *shopd) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// closedWithin reads conn until the server closes it (reads end without a
// timeout) or until limit passes; it returns what the server sent.
func closedWithin(t *testing.T, conn net.Conn, limit time.Duration) []byte {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(limit))
	got, err := io.ReadAll(conn)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection still open after %v (received %q)", limit, got)
	}
	return got
}

// A request body that stalls after a few bytes is cut off at
// -read-timeout: the connection does not stay open, holding its buffer,
// for as long as the client likes; and no order is created.
func TestShopdCutsOffStalledBody(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startShopd(t, dir, "-read-timeout", "500ms")
	for _, c := range []struct{ name, head string }{
		{"order", "POST /orders HTTP/1.1\r\nHost: shop\r\nX-User-ID: 31\r\nIdempotency-Key: stalled\r\n" +
			"Content-Type: application/json\r\nContent-Length: 1048576\r\n\r\n{\"sku\":\"A\","},
		// Refused before its body is read: the rest of the body is still
		// drained under the same deadline.
		{"unauthenticated", "POST /orders HTTP/1.1\r\nHost: shop\r\nContent-Length: 100000\r\n\r\n{\"sku\""},
		{"headers", "GET /orders HTTP/1.1\r\nHost: shop\r\nX-User-ID: 31\r\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			conn := dialShopd(t, s)
			if _, err := io.WriteString(conn, c.head); err != nil {
				t.Fatal(err)
			}
			got := closedWithin(t, conn, 20*time.Second)
			if strings.HasPrefix(string(got), "HTTP/1.1 2") {
				t.Errorf("a stalled request was answered %q", got)
			}
		})
	}
	t.Cleanup(func() {
		if n := countOrders(t, dir, "user_id = 31"); n != 0 {
			t.Errorf("%d orders from stalled requests, want 0", n)
		}
	})
}

// An idle keep-alive connection is closed after -idle-timeout.
func TestShopdClosesIdleConnections(t *testing.T) {
	t.Parallel()
	s := startShopd(t, t.TempDir(), "-idle-timeout", "500ms")
	conn := dialShopd(t, s)
	if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: shop\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("healthz: %d close=%v (%v)", resp.StatusCode, resp.Close, err)
	}
	// The connection is now idle and kept alive; the server closes it.
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	rest, err := io.ReadAll(r)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("idle connection still open after 20 s")
	}
	if len(rest) > 0 {
		t.Fatalf("server sent %q on an idle connection", rest)
	}
}
