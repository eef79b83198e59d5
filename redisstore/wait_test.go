package redisstore_test

import (
	"context"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redisproc"
	"github.com/idemkit/idem/redisstore"
	"github.com/idemkit/idem/storetest"
)

// replicated starts a primary and a replica of it, both of t's own, and
// returns clients of each once the replica's link is up.
func replicated(t testing.TB) (primary, replica *redis.Client) {
	t.Helper()
	p := redisproc.Start(t, redisproc.Options{})
	r := redisproc.Start(t, redisproc.Options{Args: []string{"--replicaof", "127.0.0.1", p.Addr[strings.LastIndexByte(p.Addr, ':')+1:]}})
	primary = redis.NewClient(&redis.Options{Addr: p.Addr})
	replica = redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = primary.Close(); _ = replica.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for {
		info, err := replica.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return primary, replica
		}
		select {
		case <-ctx.Done():
			t.Fatalf("replica's link never came up: %v, %v\n%s", err, ctx.Err(), r.Log())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func TestWaitReplicasConfig(t *testing.T) {
	t.Parallel()
	c := offlineClient(t)
	for _, cfg := range []redisstore.Config{
		{WaitReplicas: -1},
		{WaitReplicas: 1, WaitTimeout: -time.Second},
	} {
		if _, err := redisstore.New(c, &cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}, DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = ring.Close() })
	if _, err := redisstore.New(ring, &redisstore.Config{WaitReplicas: 1}); err == nil || !strings.Contains(err.Error(), "WaitReplicas") {
		t.Errorf("New(ring, WaitReplicas 1) = %v, want an error naming WaitReplicas", err)
	}
	if _, err := redisstore.New(c, &redisstore.Config{WaitReplicas: 1}); err != nil {
		t.Errorf("New(client, WaitReplicas 1): %v", err)
	}
}

// TestWaitReplicasConformance runs the Store contract on a store that
// waits for its replica.
func TestWaitReplicasConformance(t *testing.T) {
	t.Parallel()
	primary, _ := replicated(t)
	s := newStore(t, primary, &redisstore.Config{WaitReplicas: 1})
	storetest.Run(t, func(*testing.T) idem.Store { return s }, storetest.Caps{Precision: time.Millisecond})
}

// TestWaitReplicas pins what WaitReplicas promises: a write the store
// acknowledged is on the replica when the call returns, and one the
// replica did not acknowledge fails the call with ErrNotReplicated.
func TestWaitReplicas(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	primary, replica := replicated(t)
	const prefix = "idemwait"
	s := newStore(t, primary, &redisstore.Config{Prefix: prefix, WaitReplicas: 1, WaitTimeout: 500 * time.Millisecond})
	// onReplica returns the status of record ("s", key) on the replica,
	// read at once: "none" if it has none.
	onReplica := func(key string) string {
		t.Helper()
		name := prefix + ":{" + base64.RawURLEncoding.EncodeToString([]byte("s")) + "." + base64.RawURLEncoding.EncodeToString([]byte(key)) + "}"
		st, err := replica.HGet(ctx, name, "status").Result()
		switch {
		case errors.Is(err, redis.Nil):
			return "none"
		case err != nil:
			t.Fatal(err)
		}
		return st
	}
	pause := func(on bool) {
		t.Helper()
		cmd := []any{"client", "unpause"}
		if on {
			cmd = []any{"client", "pause", 60000, "write"}
		}
		if err := replica.Do(ctx, cmd...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = replica.Do(context.Background(), "client", "unpause").Err() })
	req := func(key string) idem.AcquireRequest {
		return idem.AcquireRequest{Scope: "s", Key: key, Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	}
	t.Run("acknowledged writes are on the replica", func(t *testing.T) {
		res, err := s.Acquire(ctx, req("acked"))
		if err != nil || res.Outcome != idem.Acquired {
			t.Fatalf("Acquire = %v, %v", res.Outcome, err)
		}
		if got := onReplica("acked"); got != "processing" {
			t.Fatalf("after Acquire the replica has %q, want processing", got)
		}
		l, err := s.Extend(ctx, res.Lease, time.Minute)
		if err != nil {
			t.Fatalf("Extend: %v", err)
		}
		if err := s.Complete(ctx, l, idem.Response{StatusCode: 201}, time.Hour); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		if got := onReplica("acked"); got != "completed" {
			t.Fatalf("after Complete the replica has %q, want completed", got)
		}
	})

	t.Run("an Acquire the replica did not take fails and frees the key", func(t *testing.T) {
		pause(true)
		_, err := s.Acquire(ctx, req("refused"))
		pause(false)
		if !errors.Is(err, redisstore.ErrNotReplicated) {
			t.Fatalf("Acquire with the replica paused = %v, want ErrNotReplicated", err)
		}
		if _, err := s.Get(ctx, "s", "refused"); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("Get after the refused Acquire = %v, want ErrNotFound (released)", err)
		}
		if res, err := s.Acquire(ctx, req("refused")); err != nil || res.Outcome != idem.Acquired {
			t.Fatalf("Acquire again = %v, %v; want Acquired", res.Outcome, err)
		}
	})

	t.Run("a Complete the replica did not take fails and can be retried", func(t *testing.T) {
		res, err := s.Acquire(ctx, req("late"))
		if err != nil {
			t.Fatal(err)
		}
		pause(true)
		err = s.Complete(ctx, res.Lease, idem.Response{StatusCode: 201, Body: []byte("first")}, time.Hour)
		if !errors.Is(err, redisstore.ErrNotReplicated) {
			pause(false)
			t.Fatalf("Complete with the replica paused = %v, want ErrNotReplicated", err)
		}
		if got := onReplica("late"); got != "processing" {
			pause(false)
			t.Fatalf("with the replica paused it has %q, want processing", got)
		}
		pause(false)
		if err := s.Complete(ctx, res.Lease, idem.Response{StatusCode: 201, Body: []byte("first")}, time.Hour); err != nil {
			t.Fatalf("Complete retried after the replica came back: %v", err)
		}
		if got := onReplica("late"); got != "completed" {
			t.Fatalf("after the retried Complete the replica has %q, want completed", got)
		}
	})

	t.Run("no replica", func(t *testing.T) {
		alone := privateServer(t)
		s := newStore(t, alone, &redisstore.Config{WaitReplicas: 1, WaitTimeout: 100 * time.Millisecond})
		if _, err := s.Acquire(ctx, req("alone")); !errors.Is(err, redisstore.ErrNotReplicated) {
			t.Fatalf("Acquire without a replica = %v, want ErrNotReplicated", err)
		}
	})
}

// BenchmarkWaitReplicas measures an Acquire and a Complete on a new key,
// on a primary with one replica (both of the benchmark's own, on
// loopback), with and without WaitReplicas 1, in the same run.
func BenchmarkWaitReplicas(b *testing.B) {
	primary, _ := replicated(b)
	resp := idem.Response{StatusCode: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: make([]byte, 256)}
	for _, bc := range []struct {
		name string
		n    int
	}{{"plain", 0}, {"wait1", 1}} {
		b.Run(bc.name, func(b *testing.B) {
			s := newStore(b, primary, &redisstore.Config{WaitReplicas: bc.n})
			ctx := b.Context()
			i := 0
			for b.Loop() {
				i++
				res, err := s.Acquire(ctx, idem.AcquireRequest{Scope: "bench", Key: strconv.Itoa(i), Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
				if err != nil || res.Outcome != idem.Acquired {
					b.Fatal(res.Outcome, err)
				}
				if err := s.Complete(ctx, res.Lease, resp, time.Hour); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestWaitTimeoutBelowAMillisecond: WAIT takes whole milliseconds, and
// WAIT n 0 blocks until n replicas answer, without bound. A WaitTimeout
// under a millisecond must still bound the wait, not become WAIT n 0
// (which, without a replica, held each call until the client's read
// timeout and then failed it with an i/o timeout rather than
// ErrNotReplicated).
func TestWaitTimeoutBelowAMillisecond(t *testing.T) {
	t.Parallel()
	alone := privateServer(t)
	s := newStore(t, alone, &redisstore.Config{WaitReplicas: 1, WaitTimeout: 100 * time.Microsecond})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req := idem.AcquireRequest{Scope: "s", Key: "submilli", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	if _, err := s.Acquire(ctx, req); !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Fatalf("Acquire without a replica, WaitTimeout 100µs = %v, want ErrNotReplicated", err)
	}
	// The refused Acquire released its lease: the key is free again.
	if _, err := s.Get(ctx, "s", "submilli"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get after the refused Acquire = %v, want ErrNotFound (released)", err)
	}
}
