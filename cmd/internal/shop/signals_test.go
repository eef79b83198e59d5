package shop_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/internal/obstest"
)

// waitFor polls buf until re matches, for up to 20 s.
func waitFor(t *testing.T, buf *obstest.LogBuffer, re *regexp.Regexp) []string {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := re.FindStringSubmatch(buf.String()); m != nil {
			return m
		}
	}
	t.Fatalf("no %v in %q", re, buf.String())
	return nil
}

// One stop request delivered twice at once (timeout(1) and other
// supervisors signal the process and then its process group; a terminal's
// Ctrl-C reaches every process of the foreground group) is one stop:
// in-flight requests still finish, and shopd exits with status 0. Only a
// second signal that comes later ends the drain at once.
func TestMainSignalDeliveredTwiceStillDrains(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	signals := make(chan os.Signal, 2)
	var stdout, stderr obstest.LogBuffer
	status := make(chan int, 1)
	go func() {
		status <- shop.Main([]string{"-addr", "127.0.0.1:0", "-data", dir, "-read-timeout", "1m"}, &stdout, &stderr, signals)
	}()
	addr := waitFor(t, &stdout, regexp.MustCompile(`listening on http://(\S+)`))[1]

	// An order whose body is still on its way when the signals come.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"sku":"BOOK-1","quantity":3}`
	if _, err := io.WriteString(conn, "POST /orders HTTP/1.1\r\nHost: shop\r\nX-User-ID: 41\r\nIdempotency-Key: twice\r\n"+
		"Content-Type: application/json\r\nConnection: close\r\nContent-Length: "+
		strconv.Itoa(len(body))+"\r\n\r\n"+body[:5]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let the server read the headers: the connection is active, not new

	signals <- syscall.SIGTERM
	signals <- syscall.SIGTERM
	waitFor(t, &stderr, regexp.MustCompile(`shutting down`))
	select {
	case s := <-status:
		t.Fatalf("Main returned %d before the in-flight request finished; stderr:\n%s", s, stderr.String())
	case <-time.After(500 * time.Millisecond):
	}
	if _, err := io.WriteString(conn, body[5:]); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("the in-flight order got no answer: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Errorf("in-flight order: status %d, want 201", resp.StatusCode)
	}
	select {
	case s := <-status:
		if s != shop.ExitOK {
			t.Errorf("Main returned %d, want %d (ExitOK); stderr:\n%s", s, shop.ExitOK, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Main did not return after the drain")
	}
	if n := countOrders(t, dir, "user_id = 41 AND sku = 'BOOK-1'"); n != 1 {
		t.Errorf("%d orders, want 1", n)
	}
	if strings.Contains(stderr.String(), "second") {
		t.Errorf("the duplicate signal was taken for a second stop:\n%s", stderr.String())
	}
}
