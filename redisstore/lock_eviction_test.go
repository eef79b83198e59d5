package redisstore_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/lock"
)

// TestLockSurvivesVolatileEviction fills a server whose maxmemory policy
// is volatile-ttl (which evicts the keys with a TTL nearest to its end
// first) or volatile-lru with keys that carry a TTL, until Redis has
// evicted several times as many keys as it holds: held locks survive, so
// another owner is refused and the holder still extends and releases.
func TestLockSurvivesVolatileEviction(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"volatile-ttl", "volatile-lru"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			c := privateServer(t, "--maxmemory-policy", policy)
			ctx := t.Context()
			b := newLockBackend(t, c)
			const locks = 8
			owners := make([]string, locks)
			fences := make([]int64, locks)
			for i := range locks {
				owners[i] = lock.NewOwner()
				f, err := b.Acquire(ctx, "job"+strconv.Itoa(i), owners[i], time.Hour)
				if err != nil {
					t.Fatalf("Acquire %d: %v", i, err)
				}
				fences[i] = f
			}
			limit := infoField(t, c, "memory", "used_memory") + 512<<10
			if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(limit, 10)).Err(); err != nil {
				t.Fatalf("CONFIG SET maxmemory on the test's own server: %v", err)
			}
			value := strings.Repeat("v", 1024)
			target := int64(-1)
			for batch := 0; ; batch++ {
				if batch > 2000 {
					t.Fatalf("no eviction after %d batches", batch)
				}
				p := c.Pipeline()
				for i := range 100 {
					// Longer than the locks' leases: volatile-ttl takes a
					// lock with a TTL first.
					p.Set(ctx, "fill:"+strconv.Itoa(batch)+":"+strconv.Itoa(i), value, 2*time.Hour)
				}
				if _, err := p.Exec(ctx); err != nil {
					t.Fatalf("filling the server: %v", err)
				}
				evicted := infoField(t, c, "stats", "evicted_keys")
				if evicted == 0 {
					continue
				}
				if target < 0 {
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
			for i := range locks {
				name := "job" + strconv.Itoa(i)
				if _, err := b.Acquire(ctx, name, lock.NewOwner(), time.Hour); !errors.Is(err, lock.ErrHeld) {
					t.Fatalf("Acquire of held lock %s after eviction = %v, want lock.ErrHeld", name, err)
				}
				if err := b.Extend(ctx, name, owners[i], fences[i], time.Hour); err != nil {
					t.Fatalf("Extend of held lock %s after eviction: %v", name, err)
				}
				if err := b.Release(ctx, name, owners[i], fences[i]); err != nil {
					t.Fatalf("Release of held lock %s after eviction: %v", name, err)
				}
			}
		})
	}
}
