package redisstore_test

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redisproc"
	"github.com/idemkit/idem/redisstore"
)

// privateServer starts a redis-server of t's own on a spare loopback port,
// with args added to its command line, and returns a client of it; the
// server stops when t ends. Tests that change a server's configuration
// use one, never the shared server. Without redis-server on PATH it skips
// t (fails it under IDEM_REQUIRE_SERVICES=1).
func privateServer(t *testing.T, args ...string) *redis.Client {
	t.Helper()
	srv := redisproc.Start(t, redisproc.Options{Args: args})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// infoField returns a numeric field of INFO section.
func infoField(t *testing.T, c *redis.Client, section, field string) int64 {
	t.Helper()
	info, err := c.Info(t.Context(), section).Result()
	if err != nil {
		t.Fatalf("INFO %s: %v", section, err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO %s: %s: %v", section, field, err)
			}
			return n
		}
	}
	t.Fatalf("INFO %s has no %s", section, field)
	return 0
}

// TestEvictionSparesProcessingRecords fills a server whose maxmemory
// policy is volatile-lru (the default of several managed services) with
// other keys that carry a TTL, until Redis has evicted several times as
// many keys as it holds: the processing records survive, untouched, and a
// duplicate Acquire is still told InFlight.
func TestEvictionSparesProcessingRecords(t *testing.T) {
	t.Parallel()
	c := privateServer(t, "--maxmemory-policy", "volatile-lru")
	ctx := t.Context()
	s := newStore(t, c, nil)
	const records = 8
	leases := make([]idem.Lease, records)
	reqs := make([]idem.AcquireRequest, records)
	for i := range leases {
		reqs[i] = idem.AcquireRequest{Scope: "evict", Key: "k" + strconv.Itoa(i), Fingerprint: "fp", Lease: time.Hour, Retention: time.Hour}
		res, err := s.Acquire(ctx, reqs[i])
		if err != nil || res.Outcome != idem.Acquired {
			t.Fatalf("Acquire %d = %v, %v", i, res.Outcome, err)
		}
		leases[i] = res.Lease
	}

	// A tiny maxmemory: about 512 KiB above what the server uses now.
	limit := infoField(t, c, "memory", "used_memory") + 512<<10
	if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(limit, 10)).Err(); err != nil {
		t.Fatalf("CONFIG SET maxmemory on the test's own server: %v", err)
	}
	value := strings.Repeat("v", 1024)
	target := int64(-1) // evictions to wait for, once the first one happened
	for batch := 0; ; batch++ {
		if batch > 2000 {
			t.Fatalf("no eviction after %d batches (evicted_keys %d)", batch, infoField(t, c, "stats", "evicted_keys"))
		}
		p := c.Pipeline()
		for i := range 100 {
			p.Set(ctx, "fill:"+strconv.Itoa(batch)+":"+strconv.Itoa(i), value, time.Hour)
		}
		if _, err := p.Exec(ctx); err != nil {
			t.Fatalf("filling the server: %v", err)
		}
		evicted := infoField(t, c, "stats", "evicted_keys")
		if evicted == 0 {
			continue
		}
		if target < 0 {
			// Approximate LRU samples keys: after evicting three times
			// the keyspace, a key that could be evicted almost surely was.
			n, err := c.DBSize(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			target = evicted + 3*n
		}
		if evicted >= target {
			break
		}
	}

	for i, l := range leases {
		rec, err := s.Get(ctx, l.Scope, l.Key)
		if err != nil || rec.Status != idem.StatusProcessing || rec.Owner != l.Owner || rec.Fence != l.Fence {
			t.Fatalf("processing record %d after eviction: %+v, %v; want processing, held by %q fence %d", i, rec, err, l.Owner, l.Fence)
		}
		res, err := s.Acquire(ctx, reqs[i])
		if err != nil || res.Outcome != idem.InFlight || res.Record.Owner != l.Owner {
			t.Fatalf("duplicate Acquire %d after eviction = %v (owner %q), %v; want in flight, held by %q", i, res.Outcome, res.Record.Owner, err, l.Owner)
		}
	}
}

// TestNewEvictionPolicy checks New's reading of maxmemory-policy, on
// servers of the test's own: allkeys-* is refused unless the Config
// accepts it (with a warning), volatile-* and noeviction are accepted,
// and a server that refuses CONFIG (as managed services do) does not stop
// New, which says so at info level.
func TestNewEvictionPolicy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args   []string
		allow  bool
		refuse bool
		log    string // a level and a text New logs
	}{
		{args: []string{"--maxmemory-policy", "allkeys-lru"}, refuse: true},
		{args: []string{"--maxmemory-policy", "allkeys-random"}, refuse: true},
		{args: []string{"--maxmemory-policy", "allkeys-lfu"}, allow: true, log: "level=WARN msg=\"redisstore: the server may evict processing records"},
		{args: []string{"--maxmemory-policy", "volatile-lru"}},
		{args: []string{"--maxmemory-policy", "volatile-ttl"}},
		{args: []string{"--maxmemory-policy", "noeviction"}},
		{args: []string{"--maxmemory-policy", "allkeys-lru", "--rename-command", "CONFIG", `""`}, log: "level=INFO msg=\"redisstore: cannot read the server's maxmemory-policy"},
	} {
		t.Run(strings.Join(tc.args, " ")+" allow="+strconv.FormatBool(tc.allow), func(t *testing.T) {
			t.Parallel()
			c := privateServer(t, tc.args...)
			if slices.Contains(tc.args, "--rename-command") {
				if err := c.ConfigGet(t.Context(), "maxmemory-policy").Err(); err == nil {
					t.Fatal("CONFIG GET works on a server that renamed CONFIG away")
				}
			}
			var logs bytes.Buffer
			logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			s, err := redisstore.New(c, &redisstore.Config{AllowAllKeysEviction: tc.allow, Logger: logger})
			if tc.refuse {
				if err == nil || !strings.Contains(err.Error(), "maxmemory-policy is "+tc.args[1]) || !strings.Contains(err.Error(), "AllowAllKeysEviction") {
					t.Fatalf("New = %v, want an error naming the policy and the option", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if !strings.Contains(logs.String(), tc.log) {
				t.Fatalf("New logged %q, want %q", logs.String(), tc.log)
			}
			res, err := s.Acquire(t.Context(), idem.AcquireRequest{Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
			if err != nil || res.Outcome != idem.Acquired {
				t.Fatalf("Acquire = %v, %v", res.Outcome, err)
			}
		})
	}
}

// TestNewEvictionPolicyCluster checks that New reads the policy of every
// master of a cluster, not of the one node a CONFIG GET happens to reach:
// a cluster with one allkeys-* master is refused every time. It changes a
// node of the package's own test cluster, so it does not run in parallel
// (no other test of the package runs meanwhile) and restores the policy.
func TestNewEvictionPolicyCluster(t *testing.T) {
	c := clusterClient(t)
	ctx := t.Context()
	var (
		mu      sync.Mutex
		masters []*redis.Client
	)
	if err := c.ForEachMaster(ctx, func(_ context.Context, n *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		masters = append(masters, n)
		return nil
	}); err != nil || len(masters) < 2 {
		t.Fatalf("masters: %d, %v", len(masters), err)
	}
	bad := masters[len(masters)-1]
	before, err := bad.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := bad.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bad.ConfigSet(context.Background(), "maxmemory-policy", before["maxmemory-policy"]).Err(); err != nil {
			t.Errorf("restoring the policy: %v", err)
		}
	})
	for i := range 20 {
		if _, err := redisstore.New(c, nil); err == nil || !strings.Contains(err.Error(), "allkeys-lru") {
			t.Fatalf("New %d on a cluster with an allkeys-lru master = %v, want it refused", i, err)
		}
	}
	if _, err := redisstore.New(c, &redisstore.Config{AllowAllKeysEviction: true}); err != nil {
		t.Fatalf("New with AllowAllKeysEviction: %v", err)
	}
}
