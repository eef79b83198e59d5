package shop

import (
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/obstest"
)

// A drain that runs out of time (a request still reading its body when
// the 30 s bound ends) is no failure to start or to serve: Main returns
// ExitInterrupted, as when a second signal cut the drain short, and says
// so in words, not with "context deadline exceeded".
//
// Not parallel: it shortens shutdownTimeout, which every Run reads.
func TestMainDrainOutOfTime(t *testing.T) {
	saved := shutdownTimeout
	shutdownTimeout = 300 * time.Millisecond
	defer func() { shutdownTimeout = saved }()

	signals := make(chan os.Signal, 2)
	var stdout, stderr obstest.LogBuffer
	status := make(chan int, 1)
	go func() {
		status <- Main([]string{"-addr", "127.0.0.1:0", "-data", t.TempDir(), "-read-timeout", "5m"}, &stdout, &stderr, signals)
	}()
	re := regexp.MustCompile(`listening on http://(\S+)`)
	var addr string
	for deadline := time.Now().Add(20 * time.Second); addr == ""; time.Sleep(10 * time.Millisecond) {
		if m := re.FindStringSubmatch(stdout.String()); m != nil {
			addr = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("shopd did not listen: %s", stderr.String())
		}
	}
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /orders HTTP/1.1\r\nHost: shop\r\nX-User-ID: 1\r\nIdempotency-Key: slow\r\n"+
		"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"sku\":"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the server reads the headers: the connection is active
	signals <- syscall.SIGTERM
	select {
	case s := <-status:
		if s != ExitInterrupted {
			t.Errorf("Main returned %d, want %d (ExitInterrupted); stderr:\n%s", s, ExitInterrupted, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Main did not return after the drain's bound")
	}
	if strings.Contains(stderr.String(), "deadline exceeded") {
		t.Errorf("stderr says %q", stderr.String())
	}
}
