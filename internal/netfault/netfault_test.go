package netfault

import (
	"bufio"
	"net"
	"strings"
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
