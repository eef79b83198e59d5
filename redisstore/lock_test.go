package redisstore_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idem/lock"
	"github.com/idemkit/idem/lock/locktest"
	"github.com/idemkit/idem/redisstore"
)

// newLockBackend returns a backend with a random prefix whose keys are
// deleted when t ends.
func newLockBackend(t testing.TB, c redisstore.Client) *redisstore.LockBackend {
	t.Helper()
	p := randomPrefix()
	b, err := redisstore.NewLockBackend(c, &redisstore.LockConfig{Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePrefix(t, c, p) })
	return b
}

func TestLockConformance(t *testing.T) {
	t.Parallel()
	c := singleClient(t)
	locktest.Run(t, func(t *testing.T) lock.Backend { return newLockBackend(t, c) })
}

func TestNewLockBackendRejects(t *testing.T) {
	t.Parallel()
	if _, err := redisstore.NewLockBackend(nil, nil); err == nil {
		t.Error("nil client accepted")
	}
	if _, err := redisstore.NewLockBackend(offlineClient(t), &redisstore.LockConfig{Prefix: "a{b"}); err == nil {
		t.Error("prefix with a brace accepted")
	}
}

// The keys: the lock is a hash of owner, fence and lease end with no TTL
// (a volatile-* maxmemory policy must not evict it); the counter has no
// TTL and stays after release; braces in the name leave both in one hash
// slot.
func TestLockKeys(t *testing.T) {
	t.Parallel()
	c := singleClient(t)
	b := newLockBackend(t, c)
	ctx := t.Context()
	name := "{job}:x"
	k, f := b.LockKeys(name)
	o := lock.NewOwner()
	before := time.Now()
	fence, err := b.Acquire(ctx, name, o, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	h := c.HGetAll(ctx, k).Val()
	u, err := strconv.ParseInt(h["u"], 10, 64)
	if h["o"] != o || h["f"] != "1" || err != nil {
		t.Fatalf("lock key %s = %q", k, h)
	}
	// The server's clock is the machine's: the lease ends a minute after
	// the Acquire, give or take the call.
	if end := time.UnixMilli(u); end.Before(before.Add(time.Minute-time.Second)) || end.After(time.Now().Add(time.Minute+time.Second)) {
		t.Fatalf("lease end %v, want about a minute from %v", end, before)
	}
	if ttl := c.PTTL(ctx, k).Val(); ttl != -1 {
		t.Fatalf("lock key TTL %v, want none", ttl)
	}
	if err := b.Release(ctx, name, o, fence); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, k).Val(); n != 0 {
		t.Fatal("lock key still there after Release")
	}
	if v, ttl := c.Get(ctx, f).Val(), c.PTTL(ctx, f).Val(); v != "1" || ttl != -1 {
		t.Fatalf("fence key %s = %q, TTL %v; want 1, none", f, v, ttl)
	}
	ks, err := c.ClusterKeySlot(ctx, k).Result()
	if err != nil {
		t.Skipf("CLUSTER KEYSLOT: %v", err)
	}
	if fs := c.ClusterKeySlot(ctx, f).Val(); fs != ks {
		t.Fatalf("slots %d and %d", ks, fs)
	}
}
