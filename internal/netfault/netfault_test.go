package netfault

import (
	"bufio"
	"errors"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// echo starts a line echo server and returns its address.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					c.Write([]byte(line))
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, r *bufio.Reader, msg string, timeout time.Duration) (string, error) {
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	line, err := r.ReadString('\n')
	return strings.TrimSpace(line), err
}

func TestProxy(t *testing.T) {
	p, err := New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	if got, err := roundTrip(c, r, "hello", time.Second); err != nil || got != "hello" {
		t.Fatalf("through the proxy: %q, %v", got, err)
	}

	// Stall: nothing comes back until Resume.
	p.Stall()
	if _, err := roundTrip(c, r, "stalled", 100*time.Millisecond); err == nil {
		t.Fatal("a stalled proxy answered")
	}
	p.Resume()
	c.SetDeadline(time.Now().Add(time.Second))
	if line, err := r.ReadString('\n'); err != nil || strings.TrimSpace(line) != "stalled" {
		t.Fatalf("after Resume: %q, %v", line, err)
	}

	// Drop: the open connection dies.
	p.Drop()
	if _, err := roundTrip(c, r, "dropped", time.Second); err == nil {
		t.Fatal("a dropped connection still answered")
	}

	// Refuse: new connections are closed at once; then accepted again.
	p.Refuse(true)
	c2, err := net.Dial("tcp", p.Addr())
	if err == nil {
		r2 := bufio.NewReader(c2)
		if _, err := roundTrip(c2, r2, "refused", time.Second); err == nil {
			t.Fatal("a refusing proxy answered")
		}
		c2.Close()
	}
	p.Refuse(false)
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if got, err := roundTrip(c3, bufio.NewReader(c3), "back", time.Second); err != nil || got != "back" {
		t.Fatalf("after Refuse(false): %q, %v", got, err)
	}
}

// DropResponsesIf: the server gets the request, the client never gets the
// answer, and the connection closes; other requests pass.
func TestDropResponsesIf(t *testing.T) {
	got := make(chan string, 10)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					got <- strings.TrimSpace(line) // handled, then answered
					c.Write([]byte("re: " + line))
				}
			}()
		}
	}()
	p, err := New(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var mu sync.Mutex
	var asked []string
	p.DropResponsesIf(func(request []byte) bool {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, string(request))
		return strings.HasPrefix(string(request), "lose")
	})

	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if line, err := roundTrip(c, r, "keep 1", time.Second); err != nil || line != "re: keep 1" {
		t.Fatalf("kept answer: %q, %v", line, err)
	}
	if line, err := roundTrip(c, r, "lose 2", 5*time.Second); err == nil {
		t.Fatalf("a dropped answer arrived: %q", line)
	}
	for _, want := range []string{"keep 1", "lose 2"} {
		if line := <-got; line != want {
			t.Fatalf("server got %q, want %q", line, want)
		}
	}
	// Each answer was judged by its own request.
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 2 || asked[0] != "keep 1\n" || asked[1] != "lose 2\n" {
		t.Fatalf("asked about %q", asked)
	}

	p.DropResponsesIf(nil)
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if line, err := roundTrip(c2, bufio.NewReader(c2), "lose 3", time.Second); err != nil || line != "re: lose 3" {
		t.Fatalf("after DropResponsesIf(nil): %q, %v", line, err)
	}
}

func TestReset(t *testing.T) {
	p, err := New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if got, err := roundTrip(c, r, "a", 10*time.Second); err != nil || got != "a" {
		t.Fatalf("before the reset: %q, %v", got, err)
	}
	p.Reset()
	_, err = roundTrip(c, r, "b", 10*time.Second)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("after Reset: %v, want connection reset by peer", err)
	}
	// New connections work again.
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if got, err := roundTrip(c2, bufio.NewReader(c2), "c", 10*time.Second); err != nil || got != "c" {
		t.Fatalf("a new connection after Reset: %q, %v", got, err)
	}
}

func TestLatency(t *testing.T) {
	p, err := New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	const d = 50 * time.Millisecond
	p.SetLatency(d)
	start := time.Now()
	if got, err := roundTrip(c, r, "a", 10*time.Second); err != nil || got != "a" {
		t.Fatalf("with latency: %q, %v", got, err)
	}
	// Each direction waits d at least: a lower bound, which no load can
	// break.
	if took := time.Since(start); took < 2*d {
		t.Errorf("a round trip took %v with %v of latency each way", took, d)
	}
	p.SetLatency(0)
	if got, err := roundTrip(c, r, "b", 10*time.Second); err != nil || got != "b" {
		t.Fatalf("latency off: %q, %v", got, err)
	}
}
