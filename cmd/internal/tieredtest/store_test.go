package tieredtest_test

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
	"github.com/idemkit/idem/storetest"
	"github.com/idemkit/idem/tieredstore"
)

func TestConformance(t *testing.T) {
	c := redisClient(t)
	db, truth := newTruth(t)
	s := newTiered(t, c, c, truth, nil)
	storetest.Run(t, func(*testing.T) idem.Store { return s }, storetest.Caps{
		BeginTx:   func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
		Precision: time.Millisecond,
	})
	if st := s.Stats(); st.Hits == 0 || st.Errors != 0 {
		t.Errorf("stats after the suite: %+v; want hits and no Redis errors", st)
	}
}

func TestNewConfig(t *testing.T) {
	t.Parallel()
	truth := memstore.New(nil)
	c := newClient("127.0.0.1:1") // never contacted
	t.Cleanup(func() { _ = c.Close() })
	for name, tc := range map[string]struct {
		front tieredstore.Client
		truth idem.Store
		cfg   *tieredstore.Config
	}{
		"nil client":        {nil, truth, nil},
		"nil truth":         {c, nil, nil},
		"brace in prefix":   {c, truth, &tieredstore.Config{Prefix: "a{b"}},
		"space in prefix":   {c, truth, &tieredstore.Config{Prefix: "a b"}},
		"long prefix":       {c, truth, &tieredstore.Config{Prefix: string(make([]byte, 65))}},
		"negative timeout":  {c, truth, &tieredstore.Config{Timeout: -1}},
		"negative cooldown": {c, truth, &tieredstore.Config{Cooldown: -1}},
	} {
		if _, err := tieredstore.New(tc.front, tc.truth, tc.cfg); err == nil {
			t.Errorf("New with %s succeeded, want an error", name)
		}
	}
	if _, err := tieredstore.New(c, truth, nil); err != nil {
		t.Errorf("New with defaults: %v", err)
	}
}

// The tiered store offers transactional completion exactly when its truth
// does, decided by New: a truth without it gives a store that is no
// idem.TxCompleter, so a Guard answers ErrTxUnsupported before touching
// the store.
func TestTxCompleterFollowsTruth(t *testing.T) {
	t.Parallel()
	c := newClient("127.0.0.1:1") // never contacted
	t.Cleanup(func() { _ = c.Close() })
	_, sqlTruth := newTruth(t)
	for _, tc := range []struct {
		name  string
		truth idem.Store
		tx    bool
	}{
		{"memstore", memstore.New(nil), false},
		{"sqlstore", sqlTruth, true},
	} {
		s, err := tieredstore.New(c, tc.truth, nil)
		if err != nil {
			t.Fatalf("New over %s: %v", tc.name, err)
		}
		if _, ok := any(s).(idem.TxCompleter); ok != tc.tx {
			t.Errorf("New over %s: store %T implements idem.TxCompleter = %v, want %v", tc.name, s, ok, tc.tx)
		}
		if _, ok := idem.Store(s).(idem.TxCompleter); ok != tc.tx {
			t.Errorf("New over %s, as an idem.Store: implements idem.TxCompleter = %v, want %v", tc.name, ok, tc.tx)
		}
		if _, ok := idem.Store(s).(idem.ConditionalDeleter); !ok {
			t.Errorf("New over %s (which has DeleteIf): the store %T does not implement idem.ConditionalDeleter", tc.name, s)
		}
		if s.Truth() != tc.truth {
			t.Errorf("New over %s: Truth() = %v, want the truth given", tc.name, s.Truth())
		}
	}

	// A Guard over a tiered store whose truth has no CompleteTx refuses
	// it, and the execution is untouched.
	s, err := tieredstore.New(c, memstore.New(nil), &tieredstore.Config{Timeout: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	g, err := idem.NewGuard(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	exec, res, err := g.Begin(t.Context(), "scope", "k", "fp")
	if err != nil || exec == nil {
		t.Fatalf("Begin = %v, %v", res.Outcome, err)
	}
	defer exec.Abandon()
	if err := exec.CompleteTx(t.Context(), nil, idem.Response{StatusCode: 200}); !errors.Is(err, idem.ErrTxUnsupported) {
		t.Fatalf("CompleteTx = %v, want idem.ErrTxUnsupported", err)
	}
	if err := exec.Context().Err(); err != nil {
		t.Fatalf("execution ended by a refused CompleteTx: %v", context.Cause(exec.Context()))
	}
}

func req(key string, fp idem.Fingerprint) idem.AcquireRequest {
	return idem.AcquireRequest{Scope: "tenant", Key: key, Fingerprint: fp, Lease: time.Minute, Retention: time.Hour}
}

// Replays, duplicates in flight and mismatches are answered by Redis: the
// truth sees none of them.
func TestHotPath(t *testing.T) {
	t.Parallel()
	s, truth, _ := countedTiered(t)
	ctx := t.Context()

	// In flight.
	res, err := s.Acquire(ctx, req("running", "fp"))
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("Acquire = %v, %v", res.Outcome, err)
	}
	running := res.Lease
	// Completed.
	res, err = s.Acquire(ctx, req("done", "fp"))
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("Acquire = %v, %v", res.Outcome, err)
	}
	resp := idem.Response{StatusCode: 201, Header: map[string][]string{"Location": {"/x/1"}}, Body: []byte("created")}
	if err := s.Complete(ctx, res.Lease, resp, time.Hour); err != nil {
		t.Fatal(err)
	}
	done := res.Lease

	before := truth.calls()
	for range 10 {
		for _, tc := range []struct {
			key  string
			fp   idem.Fingerprint
			want idem.Outcome
			l    idem.Lease
		}{
			{"running", "fp", idem.InFlight, running},
			{"running", "other", idem.Mismatch, running},
			{"done", "fp", idem.Completed, done},
			{"done", "other", idem.Mismatch, done},
		} {
			res, err := s.Acquire(ctx, req(tc.key, tc.fp))
			if err != nil || res.Outcome != tc.want {
				t.Fatalf("Acquire(%s, %s) = %v, %v; want %v", tc.key, tc.fp, res.Outcome, err, tc.want)
			}
			if rec := res.Record; rec.Scope != "tenant" || rec.Key != tc.key || rec.Owner != tc.l.Owner || rec.Fence != tc.l.Fence || rec.Fingerprint != "fp" {
				t.Fatalf("Acquire(%s, %s) record %+v, want the record of lease %+v", tc.key, tc.fp, rec, tc.l)
			}
			if tc.key == "done" && (res.Record.Response == nil || string(res.Record.Response.Body) != "created" || res.Record.Response.Header["Location"][0] != "/x/1") {
				t.Fatalf("replayed response %+v", res.Record.Response)
			}
		}
	}
	if n := truth.calls() - before; n != 0 {
		t.Fatalf("%d calls reached the truth for 40 replays, duplicates and mismatches; want 0", n)
	}
	if st := s.Stats(); st.Hits < 40 {
		t.Fatalf("stats %+v, want at least 40 hits", st)
	}

	// Release removes the in-flight entry: the retry runs again.
	if err := s.Release(ctx, running); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Acquire(ctx, req("running", "fp")); err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("Acquire after Release = %v, %v; want acquired", res.Outcome, err)
	}
	// Delete removes the completed entry: the key runs again.
	if err := s.Delete(ctx, "tenant", "done"); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Acquire(ctx, req("done", "fp")); err != nil || res.Outcome != idem.Acquired || res.Lease.Fence != 1 {
		t.Fatalf("Acquire after Delete = %v (fence %d), %v; want acquired, fence 1", res.Outcome, res.Lease.Fence, err)
	}
}

// A first execution costs the truth one Acquire and one completion and no
// read back: the cache is filled with the records the truth returned, and
// they are the truth's records field for field.
func TestWriteWithoutReadBack(t *testing.T) {
	t.Parallel()
	s, truth, sql := countedTiered(t)
	ctx := t.Context()
	res, err := s.Acquire(ctx, req("k", "fp"))
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("Acquire = %v, %v", res.Outcome, err)
	}
	dup, err := s.Acquire(ctx, req("k", "fp"))
	if err != nil || dup.Outcome != idem.InFlight {
		t.Fatalf("duplicate = %v, %v", dup.Outcome, err)
	}
	want, err := sql.Get(ctx, "tenant", "k")
	if err != nil {
		t.Fatal(err)
	}
	if d := storetest.DiffRecord(dup.Record, want); d != "" {
		t.Fatalf("in-flight record from the cache differs from the truth's: %s", d)
	}
	resp := idem.Response{StatusCode: 201, Header: map[string][]string{"Location": {"/x/1"}}, Body: []byte("created")}
	if err := s.Complete(ctx, res.Lease, resp, time.Hour); err != nil {
		t.Fatal(err)
	}
	resp.Body[0] = 'X' // the cache keeps no reference to the caller's body
	if a, cm, g := truth.acquire.Load(), truth.complete.Load(), truth.get.Load(); a != 1 || cm != 1 || g != 0 {
		t.Fatalf("truth saw %d Acquire, %d completions, %d Get; want 1, 1, 0", a, cm, g)
	}
	replay, err := s.Acquire(ctx, req("k", "fp"))
	if err != nil || replay.Outcome != idem.Completed {
		t.Fatalf("replay = %v, %v", replay.Outcome, err)
	}
	if truth.acquire.Load() != 1 {
		t.Fatal("the replay reached the truth")
	}
	if want, err = sql.Get(ctx, "tenant", "k"); err != nil {
		t.Fatal(err)
	}
	if d := storetest.DiffRecord(replay.Record, want); d != "" {
		t.Fatalf("completed record from the cache differs from the truth's: %s", d)
	}
	if string(replay.Record.Response.Body) != "created" {
		t.Fatalf("replayed body %q", replay.Record.Response.Body)
	}
}

// A completed record the cache has never seen (completed by another
// process, or while Redis was away) is cached by the first replay.
func TestFillFromTruth(t *testing.T) {
	t.Parallel()
	s, truth, sql := countedTiered(t)
	ctx := t.Context()
	res, err := sql.Acquire(ctx, req("k", "fp")) // behind the cache's back
	if err != nil {
		t.Fatal(err)
	}
	if err := sql.Complete(ctx, res.Lease, idem.Response{StatusCode: 200, Body: []byte("ok")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int64{1, 0, 0} {
		before := truth.acquire.Load()
		res, err := s.Acquire(ctx, req("k", "fp"))
		if err != nil || res.Outcome != idem.Completed || string(res.Record.Response.Body) != "ok" {
			t.Fatalf("replay %d = %v, %v", i, res.Outcome, err)
		}
		if n := truth.acquire.Load() - before; n != want {
			t.Fatalf("replay %d reached the truth %d times, want %d", i, n, want)
		}
	}
}

// 200 goroutines over 4 stores (4 application instances sharing Redis and
// the database) race on one key: exactly one acquires; then 200 racing
// replays are all answered by Redis.
func TestRaceOneKey(t *testing.T) {
	t.Parallel()
	c := redisClient(t)
	_, sql := newTruth(t)
	truth := &countingStore{Store: sql}
	prefix := randomPrefix()
	stores := make([]tieredstore.Store, 4)
	for i := range stores {
		stores[i] = newTiered(t, c, c, truth, &tieredstore.Config{Prefix: prefix})
	}
	ctx := t.Context()
	race := func() map[idem.Outcome][]idem.AcquireResult {
		var mu sync.Mutex
		out := map[idem.Outcome][]idem.AcquireResult{}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range 200 {
			wg.Go(func() {
				<-start
				res, err := stores[i%len(stores)].Acquire(ctx, req("k", "fp"))
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				mu.Lock()
				out[res.Outcome] = append(out[res.Outcome], res)
				mu.Unlock()
			})
		}
		close(start)
		wg.Wait()
		return out
	}
	out := race()
	if len(out[idem.Acquired]) != 1 || len(out[idem.InFlight]) != 199 {
		t.Fatalf("outcomes: %d acquired, %d in flight, %d other; want 1 and 199", len(out[idem.Acquired]), len(out[idem.InFlight]), 200-len(out[idem.Acquired])-len(out[idem.InFlight]))
	}
	w := out[idem.Acquired][0].Lease
	for _, res := range out[idem.InFlight] {
		if res.Record.Owner != w.Owner || res.Record.Fence != w.Fence {
			t.Fatalf("in-flight answer shows %q/%d, want the winner's %q/%d", res.Record.Owner, res.Record.Fence, w.Owner, w.Fence)
		}
	}
	if err := stores[0].Complete(ctx, w, idem.Response{StatusCode: 200, Body: []byte("once")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	before := truth.acquire.Load()
	out = race()
	if len(out[idem.Completed]) != 200 {
		t.Fatalf("replays: %d completed of 200", len(out[idem.Completed]))
	}
	if n := truth.acquire.Load() - before; n != 0 {
		t.Fatalf("%d replays reached the truth, want 0; stats %+v", n, stores[0].Stats())
	}
}

// Entries of one prefix are invisible to another.
func TestPrefixIsolation(t *testing.T) {
	t.Parallel()
	c := redisClient(t)
	_, truthA := newTruth(t)
	_, truthB := newTruth(t)
	a := newTiered(t, c, c, truthA, nil)
	b := newTiered(t, c, c, truthB, nil)
	ctx := t.Context()
	res, err := a.Acquire(ctx, req("k", "fp"))
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatal(res.Outcome, err)
	}
	if res, err := b.Acquire(ctx, req("k", "fp")); err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("second store's Acquire = %v, %v; want acquired", res.Outcome, err)
	}
}

func TestMarkerTTLCapsInFlightEntries(t *testing.T) {
	// An in-flight entry lives at most MarkerTTL in Redis, however long the
	// lease: a marker whose deletion failed answers 409 no longer than that.
	rc := redisClient(t)
	_, truth := newTruth(t)
	prefix := randomPrefix()
	// 2 s: the entry's TTL counts from before the truth's write, which
	// took over 200 ms with other test processes on the machine.
	s := newTiered(t, rc, rc, truth, &tieredstore.Config{Prefix: prefix, MarkerTTL: 2 * time.Second})
	req := idem.AcquireRequest{Scope: "t", Key: "k", Fingerprint: "fp", Lease: time.Hour, Retention: time.Hour}
	res, err := s.Acquire(t.Context(), req)
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("Acquire = %v, %v", res.Outcome, err)
	}
	name := prefix + ":{" + base64.RawURLEncoding.EncodeToString([]byte("t")) + "." + base64.RawURLEncoding.EncodeToString([]byte("k")) + "}"
	ttl, err := rc.PTTL(t.Context(), name).Result()
	if err != nil || ttl <= 0 || ttl > 2*time.Second {
		t.Fatalf("PTTL of the in-flight entry = %v, %v; want (0, 2s]", ttl, err)
	}
	if _, err := tieredstore.New(rc, truth, &tieredstore.Config{MarkerTTL: -1}); err == nil {
		t.Fatal("New accepted a negative MarkerTTL")
	}
}
