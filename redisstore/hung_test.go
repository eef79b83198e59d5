package redisstore_test

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/redisstore"
)

// hungServer returns the address of a loopback server that accepts
// connections and never answers (a server that swallows packets, or is
// stuck).
func hungServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// TestNewHungServer checks that New's CONFIG GET is bounded as its doc
// says, whatever the client's own read timeout: a client with no read
// timeout (or a long one, for blocking commands) against a server that
// never answers must not hold New up. New then goes on as when the policy
// cannot be read.
func TestNewHungServer(t *testing.T) {
	t.Parallel()
	addr := hungServer(t)
	for _, rt := range []time.Duration{-1, time.Hour} {
		t.Run(rt.String(), func(t *testing.T) {
			t.Parallel()
			c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: rt, WriteTimeout: rt})
			t.Cleanup(func() { _ = c.Close() })
			type result struct {
				s   *redisstore.Store
				err error
			}
			done := make(chan result, 1)
			go func() {
				s, err := redisstore.New(c, nil)
				done <- result{s, err}
			}()
			select {
			case r := <-done:
				if r.err != nil || r.s == nil {
					t.Fatalf("New against a server that never answers = %v, %v; want a store (the policy is unreadable)", r.s, r.err)
				}
			case <-time.After(30 * time.Second): // New promises a few seconds
				t.Fatal("New against a server that never answers has not returned after 30s")
			}
		})
	}
}
