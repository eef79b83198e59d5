package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/redisstore"
	"github.com/idemkit/idem/storetest"
)

// setups are the servers every server test runs against.
var setups = []struct {
	name   string
	client func(t testing.TB) redisstore.Client
}{
	{"single", func(t testing.TB) redisstore.Client { t.Helper(); return singleClient(t) }},
	{"cluster", func(t testing.TB) redisstore.Client { t.Helper(); return clusterClient(t) }},
}

func TestConformance(t *testing.T) {
	for _, setup := range setups {
		t.Run(setup.name, func(t *testing.T) {
			t.Parallel() // different servers; each store has its own prefix
			s := newStore(t, setup.client(t), nil)
			storetest.Run(t, func(*testing.T) idem.Store { return s }, storetest.Caps{Precision: time.Millisecond})
		})
	}
}

func TestRaceAcquire(t *testing.T) {
	for _, setup := range setups {
		t.Run(setup.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, setup.client(t), nil)
			ctx := t.Context()
			req := idem.AcquireRequest{Scope: "race", Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
			const n = 200
			var (
				wg       sync.WaitGroup
				start    = make(chan struct{})
				mu       sync.Mutex
				outcomes = map[idem.Outcome]int{}
				winner   idem.Lease
			)
			for range n {
				wg.Go(func() {
					<-start
					res, err := s.Acquire(ctx, req)
					if err != nil {
						t.Errorf("Acquire: %v", err)
						return
					}
					mu.Lock()
					defer mu.Unlock()
					outcomes[res.Outcome]++
					if res.Outcome == idem.Acquired {
						winner = res.Lease
					}
				})
			}
			close(start)
			wg.Wait()
			if outcomes[idem.Acquired] != 1 || outcomes[idem.InFlight] != n-1 {
				t.Fatalf("%d racing Acquire calls: %v; want 1 acquired, %d in flight", n, outcomes, n-1)
			}
			// The effect: one record, held by the winner.
			rec, err := s.Get(ctx, req.Scope, req.Key)
			if err != nil || rec.Owner != winner.Owner || rec.Fence != 1 {
				t.Fatalf("record after the race: %+v, %v; want the winner's %q with fence 1", rec, err, winner.Owner)
			}
		})
	}
}

// TestNoScript flushes the server's script cache: the next operations load
// their scripts again (EVALSHA answers NOSCRIPT, then EVAL).
func TestNoScript(t *testing.T) {
	for _, setup := range setups {
		t.Run(setup.name, func(t *testing.T) {
			c := setup.client(t)
			s := newStore(t, c, nil)
			ctx := t.Context()
			flush := func() {
				t.Helper()
				var err error
				switch c := c.(type) {
				case *redis.ClusterClient:
					err = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return n.ScriptFlush(ctx).Err() })
				case *redis.Client:
					err = c.ScriptFlush(ctx).Err()
				}
				if err != nil {
					t.Fatalf("SCRIPT FLUSH: %v", err)
				}
			}
			req := idem.AcquireRequest{Scope: "noscript", Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
			flush()
			res, err := s.Acquire(ctx, req)
			if err != nil || res.Outcome != idem.Acquired {
				t.Fatalf("Acquire after SCRIPT FLUSH = %v, %v", res.Outcome, err)
			}
			flush()
			l, err := s.Extend(ctx, res.Lease, time.Minute)
			if err != nil {
				t.Fatalf("Extend after SCRIPT FLUSH: %v", err)
			}
			flush()
			if err := s.Complete(ctx, l, idem.Response{StatusCode: 200, Body: []byte("ok")}, 50*time.Millisecond); err != nil {
				t.Fatalf("Complete after SCRIPT FLUSH: %v", err)
			}
			flush()
			l2, err := s.Acquire(ctx, idem.AcquireRequest{Scope: "noscript", Key: "k2", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
			if err != nil {
				t.Fatalf("Acquire after SCRIPT FLUSH: %v", err)
			}
			flush()
			if err := s.Release(ctx, l2.Lease); err != nil {
				t.Fatalf("Release after SCRIPT FLUSH: %v", err)
			}
			l3, err := s.Acquire(ctx, idem.AcquireRequest{Scope: "noscript", Key: "k3", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
			if err != nil {
				t.Fatalf("Acquire after SCRIPT FLUSH: %v", err)
			}
			flush()
			if err := s.DeleteIf(ctx, "noscript", "k3", l3.Lease.Owner, l3.Lease.Fence); err != nil {
				t.Fatalf("DeleteIf after SCRIPT FLUSH: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
			flush()
			if n, err := s.Sweep(ctx, 10); err != nil || n != 1 {
				t.Fatalf("Sweep after SCRIPT FLUSH = %d, %v; want 1 (the expired record)", n, err)
			}
		})
	}
}

// TestKeySlot checks that a record's slot is decided by its hash tag, the
// encoded (scope, key), whatever braces the scope and key hold.
func TestKeySlot(t *testing.T) {
	c := clusterClient(t)
	ctx := t.Context()
	a := newStore(t, c, &redisstore.Config{Prefix: randomPrefix()})
	b := newStore(t, c, &redisstore.Config{Prefix: "other:" + randomPrefix()})
	for _, id := range [][2]string{{"", "k"}, {"tenant", "order-1"}, {"a{b", "c}d"}, {"}{", "{}"}, {"x:y", "z"}} {
		ka, kb := a.RecordKey(id[0], id[1]), b.RecordKey(id[0], id[1])
		tag := ka[strings.IndexByte(ka, '{')+1 : strings.IndexByte(ka, '}')]
		if strings.IndexByte(ka, '}') != len(ka)-1 {
			t.Fatalf("record key %q: the hash tag does not end the key", ka)
		}
		slots := make([]int64, 3)
		for i, k := range []string{ka, kb, tag} {
			n, err := c.ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatalf("CLUSTER KEYSLOT %q: %v", k, err)
			}
			slots[i] = n
		}
		if slots[0] != slots[1] || slots[0] != slots[2] {
			t.Fatalf("(%q, %q): slots %v of %q, %q and the tag %q differ", id[0], id[1], slots, ka, kb, tag)
		}
		// And the record lives there: a full cycle works on the cluster.
		res, err := a.Acquire(ctx, idem.AcquireRequest{Scope: id[0], Key: id[1], Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
		if err != nil || res.Outcome != idem.Acquired {
			t.Fatalf("Acquire(%q, %q) = %v, %v", id[0], id[1], res.Outcome, err)
		}
		if err := a.Complete(ctx, res.Lease, idem.Response{StatusCode: 200}, time.Hour); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		if n, err := c.Exists(ctx, ka).Result(); err != nil || n != 1 {
			t.Fatalf("EXISTS %q = %d, %v", ka, n, err)
		}
	}
}

// TestTTL checks the TTL Redis keeps on a record: none while it is
// processing, so that no maxmemory policy but allkeys-* can evict a live
// lease; ExpiresAt plus the grace once it is completed.
func TestTTL(t *testing.T) {
	for _, setup := range setups {
		for _, tc := range []struct {
			name       string
			grace      time.Duration
			extraGrace time.Duration
		}{
			{"default grace", 0, redisstore.DefaultGrace},
			{"grace 5s", 5 * time.Second, 5 * time.Second},
			{"no grace", -1, 0},
		} {
			t.Run(setup.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				c := setup.client(t)
				ctx := t.Context()
				s := newStore(t, c, &redisstore.Config{Grace: tc.grace})
				pttl := func(key string) time.Duration {
					t.Helper()
					d, err := c.(interface {
						PTTL(context.Context, string) *redis.DurationCmd
					}).PTTL(ctx, s.RecordKey("ttl", key)).Result()
					if err != nil {
						t.Fatalf("PTTL: %v", err)
					}
					return d
				}
				near := func(what string, got, want time.Duration) {
					t.Helper()
					if got > want || got < want-2*time.Second {
						t.Fatalf("%s: PTTL = %v, want about %v", what, got, want)
					}
				}
				persistent := func(what string) {
					t.Helper()
					if d := pttl("k"); d != -1 {
						t.Fatalf("%s: PTTL = %v, want -1 (no TTL: a processing record must not be evictable)", what, d)
					}
				}
				lease, retention, completedRetention := 30*time.Second, 2*time.Hour, 3*time.Hour
				res, err := s.Acquire(ctx, idem.AcquireRequest{Scope: "ttl", Key: "k", Fingerprint: "fp", Lease: lease, Retention: retention})
				if err != nil {
					t.Fatalf("Acquire: %v", err)
				}
				persistent("processing")
				l, err := s.Extend(ctx, res.Lease, 2*lease)
				if err != nil {
					t.Fatalf("Extend: %v", err)
				}
				persistent("extended")
				if err := s.Complete(ctx, l, idem.Response{StatusCode: 200}, completedRetention); err != nil {
					t.Fatalf("Complete: %v", err)
				}
				near("completed", pttl("k"), completedRetention+tc.extraGrace)
			})
		}
	}
}

// TestAbandonedProcessingRecord checks what replaces the TTL for a
// processing record whose process died: Sweep removes it once its lease
// ended more than its retention ago (ExpiresAt), never before, and an
// Acquire past its ExpiresAt replaces it.
func TestAbandonedProcessingRecord(t *testing.T) {
	for _, setup := range setups {
		t.Run(setup.name, func(t *testing.T) {
			t.Parallel()
			c := setup.client(t)
			s := newStore(t, c, nil)
			ctx := t.Context()
			// The checks after the lease's end must come before the end of
			// the retention, on a loaded machine too: a second apart.
			const lease, retention = 100 * time.Millisecond, 1200 * time.Millisecond
			req := func(key string) idem.AcquireRequest {
				return idem.AcquireRequest{Scope: "abandoned", Key: key, Fingerprint: "fp", Lease: lease, Retention: retention}
			}
			swept, err := s.Acquire(ctx, req("swept"))
			if err != nil || swept.Outcome != idem.Acquired {
				t.Fatalf("Acquire = %v, %v", swept.Outcome, err)
			}
			replaced, err := s.Acquire(ctx, req("replaced"))
			if err != nil || replaced.Outcome != idem.Acquired {
				t.Fatalf("Acquire = %v, %v", replaced.Outcome, err)
			}
			time.Sleep(lease + 50*time.Millisecond)
			// The lease ended, the retention did not: Sweep keeps both.
			if n, err := s.Sweep(ctx, 0); err != nil || n != 0 {
				t.Fatalf("Sweep after the lease = %d, %v; want 0", n, err)
			}
			if _, err := s.Get(ctx, "abandoned", "swept"); err != nil {
				t.Fatalf("Get after the lease: %v", err)
			}
			time.Sleep(retention)
			before := time.Now()
			res, err := s.Acquire(ctx, req("replaced"))
			if err != nil || res.Outcome != idem.Acquired || !res.TookOver || res.Lease.Fence != replaced.Lease.Fence+1 ||
				res.Record.CreatedAt.Before(before.Add(-time.Second)) {
				t.Fatalf("Acquire past ExpiresAt = %+v, %v; want a new record, taken over, fence %d", res, err, replaced.Lease.Fence+1)
			}
			if n, err := s.Sweep(ctx, 0); err != nil || n != 1 {
				t.Fatalf("Sweep past ExpiresAt = %d, %v; want 1 (the abandoned record)", n, err)
			}
			if _, err := s.Get(ctx, "abandoned", "swept"); !errors.Is(err, idem.ErrNotFound) {
				t.Fatalf("Get of the swept record = %v, want idem.ErrNotFound", err)
			}
			if got := countPrefix(t, c, s.Prefix()); got != 1 {
				t.Fatalf("%d keys left, want 1 (the replacing record)", got)
			}
		})
	}
}

// TestPersistOldRecords checks that a processing record written with a
// TTL (as earlier versions of the store did) loses it when its lease is
// extended or taken over.
func TestPersistOldRecords(t *testing.T) {
	c := singleClient(t)
	s := newStore(t, c, nil)
	ctx := t.Context()
	for _, op := range []string{"extend", "takeover"} {
		lease := time.Minute
		if op == "takeover" {
			lease = 50 * time.Millisecond
		}
		req := idem.AcquireRequest{Scope: "old", Key: op, Fingerprint: "fp", Lease: lease, Retention: time.Hour}
		res, err := s.Acquire(ctx, req)
		if err != nil || res.Outcome != idem.Acquired {
			t.Fatalf("Acquire = %v, %v", res.Outcome, err)
		}
		key := s.RecordKey(req.Scope, req.Key)
		if err := c.PExpire(ctx, key, 2*time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		switch op {
		case "extend":
			_, err = s.Extend(ctx, res.Lease, time.Minute)
		case "takeover":
			time.Sleep(2 * lease)
			res, err = s.Acquire(ctx, req)
			if err == nil && (res.Outcome != idem.Acquired || !res.TookOver) {
				t.Fatalf("Acquire after the lease = %+v, want a takeover", res)
			}
		}
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		if d, err := c.PTTL(ctx, key).Result(); err != nil || d != -1 {
			t.Fatalf("PTTL after %s of a record with a TTL = %v, %v; want -1", op, d, err)
		}
	}
}

// TestNoGrace pins what a store without grace does: Redis deletes a record
// at its ExpiresAt, so Get no longer finds it and a new Acquire starts a
// new record at fence 1. A stale lease still cannot touch it: the owner
// differs.
func TestNoGrace(t *testing.T) {
	c := singleClient(t)
	ctx := t.Context()
	s := newStore(t, c, &redisstore.Config{Grace: -1})
	req := idem.AcquireRequest{Scope: "nograce", Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	old, err := s.Acquire(ctx, req)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := s.Complete(ctx, old.Lease, idem.Response{StatusCode: 200}, 50*time.Millisecond); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	time.Sleep(150 * time.Millisecond)
	if _, err := s.Get(ctx, req.Scope, req.Key); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get after the TTL = %v, want idem.ErrNotFound", err)
	}
	res, err := s.Acquire(ctx, req)
	if err != nil || res.Outcome != idem.Acquired || res.Lease.Fence != 1 || res.TookOver {
		t.Fatalf("Acquire after the TTL = %+v, %v; want acquired, fence 1", res, err)
	}
	stale := old.Lease
	if err := s.Complete(ctx, stale, idem.Response{StatusCode: 500}, time.Hour); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("stale Complete on the new record of the same fence = %v, want idem.ErrLeaseLost", err)
	}
}

// TestCanceledContext checks that every operation answers a canceled
// context with the context's error.
func TestCanceledContext(t *testing.T) {
	s := newStore(t, singleClient(t), nil)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	l := idem.Lease{Scope: "s", Key: "k", Owner: "o", Fence: 1}
	_, errAcquire := s.Acquire(ctx, idem.AcquireRequest{Key: "k", Lease: time.Second, Retention: time.Second})
	_, errExtend := s.Extend(ctx, l, time.Second)
	_, errGet := s.Get(ctx, "s", "k")
	_, errSweep := s.Sweep(ctx, 0)
	for name, err := range map[string]error{
		"Acquire": errAcquire, "Extend": errExtend, "Get": errGet, "Sweep": errSweep,
		"Complete": s.Complete(ctx, l, idem.Response{}, time.Second),
		"Release":  s.Release(ctx, l),
		"Delete":   s.Delete(ctx, "s", "k"),
	} {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a canceled context = %v, want context.Canceled", name, err)
		}
	}
}

// TestServerDown checks that errors of an unreachable server are wrapped
// with the operation and never mistaken for a verdict.
func TestServerDown(t *testing.T) {
	c := offlineClient(t)
	s, err := redisstore.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	_, err = s.Acquire(ctx, idem.AcquireRequest{Key: "k", Lease: time.Second, Retention: time.Second})
	if err == nil || !strings.HasPrefix(err.Error(), "redisstore: acquire: ") {
		t.Fatalf("Acquire on a closed port = %v, want a wrapped error", err)
	}
	if _, err := s.Get(ctx, "", "k"); err == nil || errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get on a closed port = %v, want an error other than ErrNotFound", err)
	}
	if err := s.Complete(ctx, idem.Lease{Key: "k"}, idem.Response{}, time.Second); err == nil || errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Complete on a closed port = %v, want an error other than ErrLeaseLost", err)
	}
}

func TestNewConfig(t *testing.T) {
	c := offlineClient(t)
	if _, err := redisstore.New(nil, nil); err == nil {
		t.Error("New(nil, nil) succeeded, want an error")
	}
	for _, p := range []string{"a{b", "a}b", "a b", "a\nb", strings.Repeat("p", 65)} {
		if _, err := redisstore.New(c, &redisstore.Config{Prefix: p}); err == nil {
			t.Errorf("New with prefix %q succeeded, want an error", p)
		}
	}
	for _, p := range []string{"", "idem", "app:idem", "a*b?[c]", strings.Repeat("p", 64)} {
		if _, err := redisstore.New(c, &redisstore.Config{Prefix: p}); err != nil {
			t.Errorf("New with prefix %q: %v", p, err)
		}
	}
}

// TestRecordKey checks the key encoding without a server: distinct
// (scope, key) pairs get distinct names, and the hash tag holds no brace.
func TestRecordKey(t *testing.T) {
	c := offlineClient(t)
	s, err := redisstore.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.RecordKey("tenant", "order-1"), "idem:{dGVuYW50.b3JkZXItMQ}"; got != want {
		t.Errorf("RecordKey = %q, want %q", got, want)
	}
	seen := map[string][2]string{}
	parts := []string{"", "a", "b", ".", "a.b", "a:b", "{", "}", "{}", "a}b{c", "ab", "YQ", "=", "-_"}
	for _, scope := range parts {
		for _, key := range parts[1:] {
			k := s.RecordKey(scope, key)
			if prev, ok := seen[k]; ok {
				t.Fatalf("(%q, %q) and (%q, %q) share the name %q", scope, key, prev[0], prev[1], k)
			}
			seen[k] = [2]string{scope, key}
			if strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 || !strings.HasSuffix(k, "}") {
				t.Fatalf("name %q has braces outside its hash tag", k)
			}
		}
	}
}

func TestHeaderEncoding(t *testing.T) {
	for _, h := range []map[string][]string{
		nil,
		{"A": {"1"}},
		{"Link": {"</a>; rel=next", "</b>"}, "X-Empty": {""}, "X-None": {}, "X-Bin": {"\x00\xff\n"}},
	} {
		got, err := redisstore.DecodeHeader(string(redisstore.EncodeHeader(h)))
		if err != nil || fmt.Sprint(got) != fmt.Sprint(h) && len(h) > 0 {
			t.Errorf("round trip of %q = %q, %v", h, got, err)
		}
	}
	for _, bad := range []string{"\x05ab", "\x01a\x02\x01b", "\x01a\xff", "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"} {
		if _, err := redisstore.DecodeHeader(bad); err == nil {
			t.Errorf("DecodeHeader(%q) succeeded, want an error", bad)
		}
	}
}

func FuzzHeader(f *testing.F) {
	f.Add("\x01A\x01\x011")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		h, err := redisstore.DecodeHeader(s)
		if err != nil {
			return
		}
		again, err := redisstore.DecodeHeader(string(redisstore.EncodeHeader(h)))
		if err != nil || fmt.Sprintf("%q", again) != fmt.Sprintf("%q", h) {
			t.Fatalf("re-encoding %q gives %q, %v", h, again, err)
		}
	})
}
