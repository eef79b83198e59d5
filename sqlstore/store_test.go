package sqlstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

// These tests pin each outcome directly; storetest.Run pins the whole
// contract on top of them.

const (
	long  = time.Hour
	short = 60 * time.Millisecond
)

func req(key string, fp idem.Fingerprint, lease time.Duration) idem.AcquireRequest {
	return idem.AcquireRequest{Scope: "tenant", Key: key, Fingerprint: fp, Lease: lease, Retention: long}
}

func mustAcquire(t *testing.T, s idem.Store, r idem.AcquireRequest, want idem.Outcome) idem.AcquireResult {
	t.Helper()
	res, err := s.Acquire(t.Context(), r)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", r.Key, err)
	}
	if res.Outcome != want {
		t.Fatalf("Acquire(%q) = %v, want %v (%+v)", r.Key, res.Outcome, want, res)
	}
	return res
}

func TestAcquireOutcomes(t *testing.T) {
	t.Parallel()
	_, s := setup(t)
	ctx := t.Context()

	t.Run("new key: fence 1", func(t *testing.T) {
		res := mustAcquire(t, s, req("new", "fp", long), idem.Acquired)
		if res.Lease.Fence != 1 || res.TookOver || res.Lease.Owner == "" {
			t.Fatalf("lease = %+v, took over %v", res.Lease, res.TookOver)
		}
		if d := time.Until(res.Lease.Until) - long; d > 2*time.Second || d < -2*time.Second {
			t.Fatalf("lease until %v is not now + %v", res.Lease.Until, long)
		}
		rec, err := s.Get(ctx, "tenant", "new")
		if err != nil {
			t.Fatal(err)
		}
		if rec.Status != idem.StatusProcessing || rec.Owner != res.Lease.Owner || rec.Response != nil ||
			!rec.ExpiresAt.Equal(rec.LeaseUntil.Add(long)) || rec.Retention != long || !rec.CompletedAt.IsZero() {
			t.Fatalf("record = %+v", rec)
		}
	})

	t.Run("live processing: in flight", func(t *testing.T) {
		first := mustAcquire(t, s, req("busy", "fp", long), idem.Acquired)
		res := mustAcquire(t, s, req("busy", "fp", long), idem.InFlight)
		if res.Record.Owner != first.Lease.Owner || res.Record.Status != idem.StatusProcessing {
			t.Fatalf("record = %+v", res.Record)
		}
	})

	t.Run("other fingerprint on live processing: mismatch", func(t *testing.T) {
		mustAcquire(t, s, req("mm-live", "a", long), idem.Acquired)
		res := mustAcquire(t, s, req("mm-live", "b", long), idem.Mismatch)
		if res.Record.Fingerprint != "a" {
			t.Fatalf("record fingerprint %q", res.Record.Fingerprint)
		}
	})

	t.Run("other fingerprint on expired processing: mismatch", func(t *testing.T) {
		mustAcquire(t, s, req("mm-expired", "a", short), idem.Acquired)
		time.Sleep(short + 20*time.Millisecond)
		mustAcquire(t, s, req("mm-expired", "b", long), idem.Mismatch)
	})

	t.Run("expired processing: takeover, fence+1", func(t *testing.T) {
		first := mustAcquire(t, s, req("takeover", "fp", short), idem.Acquired)
		before, _ := s.Get(ctx, "tenant", "takeover")
		time.Sleep(short + 20*time.Millisecond)
		res := mustAcquire(t, s, req("takeover", "fp", long), idem.Acquired)
		if !res.TookOver || res.Lease.Fence != 2 || res.Lease.Owner == first.Lease.Owner {
			t.Fatalf("takeover = %+v", res)
		}
		rec, _ := s.Get(ctx, "tenant", "takeover")
		if !rec.CreatedAt.Equal(before.CreatedAt) {
			t.Fatalf("takeover changed CreatedAt from %v to %v", before.CreatedAt, rec.CreatedAt)
		}
		// The old owner can no longer complete, extend or release.
		if err := s.Complete(ctx, first.Lease, idem.Response{StatusCode: 200}, long); !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("stale Complete = %v", err)
		}
		if _, err := s.Extend(ctx, first.Lease, long); !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("stale Extend = %v", err)
		}
		if err := s.Release(ctx, first.Lease); !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("stale Release = %v", err)
		}
	})

	t.Run("live completed: completed with response", func(t *testing.T) {
		l := mustAcquire(t, s, req("done", "fp", long), idem.Acquired).Lease
		resp := idem.Response{StatusCode: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":1}`)}
		if err := s.Complete(ctx, l, resp, long); err != nil {
			t.Fatal(err)
		}
		res := mustAcquire(t, s, req("done", "fp", long), idem.Completed)
		got := res.Record.Response
		if got == nil || got.StatusCode != 201 || string(got.Body) != `{"id":1}` || got.Header["Content-Type"][0] != "application/json" {
			t.Fatalf("response = %+v", got)
		}
		if res.Record.CompletedAt.IsZero() || !res.Record.ExpiresAt.Equal(res.Record.CompletedAt.Add(long)) {
			t.Fatalf("record = %+v", res.Record)
		}
		mustAcquire(t, s, req("done", "other", long), idem.Mismatch)
	})

	t.Run("expired completed: replaced whatever the fingerprint, fence+1", func(t *testing.T) {
		l := mustAcquire(t, s, req("replaced", "a", long), idem.Acquired).Lease
		if err := s.Complete(ctx, l, idem.Response{StatusCode: 200, Body: []byte("x")}, short); err != nil {
			t.Fatal(err)
		}
		time.Sleep(short + 20*time.Millisecond)
		res := mustAcquire(t, s, req("replaced", "b", long), idem.Acquired)
		if res.TookOver || res.Lease.Fence != 2 {
			t.Fatalf("replace = %+v", res)
		}
		rec, _ := s.Get(ctx, "tenant", "replaced")
		if rec.Status != idem.StatusProcessing || rec.Fingerprint != "b" || rec.Response != nil || !rec.CompletedAt.IsZero() {
			t.Fatalf("replaced record = %+v", rec)
		}
	})
}

func TestLeaseOperations(t *testing.T) {
	t.Parallel()
	_, s := setup(t)
	ctx := t.Context()

	l := mustAcquire(t, s, req("k", "fp", short), idem.Acquired).Lease
	l2, err := s.Extend(ctx, l, long)
	if err != nil {
		t.Fatal(err)
	}
	if !l2.Until.After(l.Until) || l2.Fence != l.Fence || l2.Owner != l.Owner {
		t.Fatalf("extended lease %+v from %+v", l2, l)
	}
	rec, _ := s.Get(ctx, "tenant", "k")
	if !rec.LeaseUntil.Equal(l2.Until) || !rec.ExpiresAt.Equal(l2.Until.Add(long)) {
		t.Fatalf("record after extend = %+v", rec)
	}
	time.Sleep(short + 20*time.Millisecond)
	mustAcquire(t, s, req("k", "fp", long), idem.InFlight) // the extension holds

	wrong := []idem.Lease{
		{Scope: l.Scope, Key: l.Key, Owner: "someone else", Fence: l.Fence},
		{Scope: l.Scope, Key: l.Key, Owner: l.Owner, Fence: l.Fence + 1},
		{Scope: l.Scope, Key: "other", Owner: l.Owner, Fence: l.Fence},
		{Scope: l.Scope, Key: l.Key, Fence: l.Fence},
		{Scope: l.Scope, Key: l.Key, Owner: l.Owner},
	}
	for _, w := range wrong {
		if err := s.Complete(ctx, w, idem.Response{}, long); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("Complete(%+v) = %v, want ErrLeaseLost", w, err)
		}
		if _, err := s.Extend(ctx, w, long); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("Extend(%+v) = %v, want ErrLeaseLost", w, err)
		}
		if err := s.Release(ctx, w); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("Release(%+v) = %v, want ErrLeaseLost", w, err)
		}
	}

	// A lease that ran out but was not taken over still completes.
	l3 := mustAcquire(t, s, req("late", "fp", short), idem.Acquired).Lease
	time.Sleep(short + 20*time.Millisecond)
	if err := s.Complete(ctx, l3, idem.Response{StatusCode: 204}, long); err != nil {
		t.Fatalf("late Complete: %v", err)
	}
	// A second Complete with the same lease is a retry: nil, and the
	// first response stays.
	if err := s.Complete(ctx, l3, idem.Response{StatusCode: 500}, long); err != nil {
		t.Fatalf("second Complete = %v, want nil", err)
	}
	if rec, err := s.Get(ctx, "tenant", "late"); err != nil || rec.Response == nil || rec.Response.StatusCode != 204 {
		t.Fatalf("after the second Complete: %+v, %v; want the first response (204)", rec, err)
	}
	if err := s.Release(ctx, l3); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Release of completed = %v, want ErrLeaseLost", err)
	}

	// Release deletes, so a retry runs again with a new record.
	l4 := mustAcquire(t, s, req("released", "fp", long), idem.Acquired).Lease
	if err := s.Release(ctx, l4); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "tenant", "released"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get after Release = %v", err)
	}
	if res := mustAcquire(t, s, req("released", "fp", long), idem.Acquired); res.Lease.Fence != 1 {
		t.Fatalf("after release fence = %d", res.Lease.Fence)
	}
}

func TestGetDelete(t *testing.T) {
	t.Parallel()
	_, s := setup(t)
	ctx := t.Context()
	if _, err := s.Get(ctx, "tenant", "none"); !errors.Is(err, idem.ErrNotFound) || errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("Get(missing) = %v", err)
	}
	if err := s.Delete(ctx, "tenant", "none"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Delete(missing) = %v", err)
	}
	mustAcquire(t, s, req("k", "fp", long), idem.Acquired)
	if _, err := s.Get(ctx, "other tenant", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get in another scope = %v", err)
	}
	if err := s.Delete(ctx, "tenant", "k"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "tenant", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("second Delete = %v", err)
	}
}

func TestResponseRoundTrip(t *testing.T) {
	t.Parallel()
	_, s := setup(t)
	ctx := t.Context()
	big := make([]byte, 4<<20)
	rand.Read(big)
	cases := []struct {
		name string
		resp idem.Response
	}{
		{"empty", idem.Response{}},
		{"binary", idem.Response{StatusCode: 200, Body: []byte{0, 1, 2, 0xff, 0, '\n'}}},
		{"large", idem.Response{StatusCode: 200, Body: big}},
		{"omitted", idem.Response{StatusCode: 200, BodyOmitted: true, Header: map[string][]string{"Content-Type": {"text/plain"}}}},
		{"multi-header", idem.Response{StatusCode: -7, Header: map[string][]string{"X-A": {"1", "2"}, "X-B": {""}}}},
	}
	for _, c := range cases {
		l := mustAcquire(t, s, req("rt-"+c.name, "fp-ключ", long), idem.Acquired).Lease
		if err := s.Complete(ctx, l, c.resp, long); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		rec, err := s.Get(ctx, "tenant", "rt-"+c.name)
		if err != nil {
			t.Fatal(err)
		}
		got := rec.Response
		if got == nil || got.StatusCode != c.resp.StatusCode || got.BodyOmitted != c.resp.BodyOmitted ||
			!bytes.Equal(got.Body, c.resp.Body) || len(got.Header) != len(c.resp.Header) {
			t.Fatalf("%s: got %+v", c.name, got)
		}
		for k, v := range c.resp.Header {
			if strings.Join(got.Header[k], "|") != strings.Join(v, "|") {
				t.Fatalf("%s: header %q = %q, want %q", c.name, k, got.Header[k], v)
			}
		}
		if rec.Fingerprint != "fp-ключ" {
			t.Fatalf("fingerprint %q did not round trip", rec.Fingerprint)
		}
	}
}

func TestSweep(t *testing.T) {
	t.Parallel()
	_, s := setup(t)
	ctx := t.Context()
	live := mustAcquire(t, s, idem.AcquireRequest{Scope: "tenant", Key: "live", Fingerprint: "fp", Lease: long, Retention: time.Millisecond}, idem.Acquired).Lease
	for i := range 5 {
		l := mustAcquire(t, s, req("done-"+string(rune('a'+i)), "fp", long), idem.Acquired).Lease
		if err := s.Complete(ctx, l, idem.Response{StatusCode: 200}, time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	mustAcquire(t, s, idem.AcquireRequest{Scope: "tenant", Key: "abandoned", Fingerprint: "fp", Lease: time.Millisecond, Retention: time.Millisecond}, idem.Acquired)
	mustAcquire(t, s, req("kept", "fp", long), idem.Acquired)
	time.Sleep(20 * time.Millisecond)

	if n, err := s.Sweep(ctx, 2); err != nil || n != 2 {
		t.Fatalf("Sweep(2) = %d, %v", n, err)
	}
	if n, err := s.Sweep(ctx, 0); err != nil || n != 4 {
		t.Fatalf("Sweep(0) = %d, %v", n, err)
	}
	if n, err := s.Sweep(ctx, -1); err != nil || n != 0 {
		t.Fatalf("third Sweep = %d, %v", n, err)
	}
	for _, k := range []string{"live", "kept"} {
		if _, err := s.Get(ctx, "tenant", k); err != nil {
			t.Fatalf("Sweep removed %q: %v", k, err)
		}
	}
	if err := s.Complete(ctx, live, idem.Response{StatusCode: 200}, long); err != nil {
		t.Fatal(err)
	}
}

func TestValidation(t *testing.T) {
	t.Parallel()
	_, s := setup(t)
	ctx := t.Context()
	good := idem.Lease{Scope: "s", Key: "k", Owner: "o", Fence: 1}
	checks := []struct {
		name string
		err  error
		want error // nil: any error
	}{
		{"empty key", func() error { _, err := s.Acquire(ctx, req("", "fp", long)); return err }(), idem.ErrInvalidKey},
		{"control key", func() error { _, err := s.Acquire(ctx, req("a\nb", "fp", long)); return err }(), idem.ErrInvalidKey},
		{"long key", func() error { _, err := s.Acquire(ctx, req(strings.Repeat("k", 256), "fp", long)); return err }(), idem.ErrInvalidKey},
		{"bad scope", func() error {
			_, err := s.Acquire(ctx, idem.AcquireRequest{Scope: "\x00", Key: "k", Lease: long, Retention: long})
			return err
		}(), idem.ErrInvalidScope},
		{"zero lease", func() error { _, err := s.Acquire(ctx, req("k", "fp", 0)); return err }(), nil},
		{"zero retention", func() error {
			_, err := s.Acquire(ctx, idem.AcquireRequest{Scope: "s", Key: "k", Lease: long})
			return err
		}(), nil},
		{"complete zero retention", s.Complete(ctx, good, idem.Response{}, 0), nil},
		{"complete bad key", s.Complete(ctx, idem.Lease{Scope: "s", Owner: "o", Fence: 1}, idem.Response{}, long), idem.ErrInvalidKey},
		{"complete nil tx", s.CompleteTx(ctx, nil, good, idem.Response{}, long), nil},
		{"extend zero ttl", func() error { _, err := s.Extend(ctx, good, 0); return err }(), nil},
		{"get bad key", func() error { _, err := s.Get(ctx, "s", ""); return err }(), idem.ErrInvalidKey},
		{"delete bad key", s.Delete(ctx, "s", ""), idem.ErrInvalidKey},
	}
	for _, c := range checks {
		if c.err == nil || (c.want != nil && !errors.Is(c.err, c.want)) {
			t.Errorf("%s: err = %v, want %v", c.name, c.err, c.want)
		}
		if c.err != nil && !strings.HasPrefix(c.err.Error(), "sqlstore: ") {
			t.Errorf("%s: error %q does not say where it comes from", c.name, c.err)
		}
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	db := openDB(t, t.TempDir()+"/x.db")
	if _, err := sqlstore.New(nil, &sqlstore.Config{Dialect: sqlstore.SQLite}); err == nil {
		t.Error("New(nil db) succeeded")
	}
	if _, err := sqlstore.New(db, nil); err == nil {
		t.Error("New(nil config) succeeded")
	}
	if _, err := sqlstore.New(db, &sqlstore.Config{}); err == nil {
		t.Error("New without dialect succeeded")
	}
	// Not migrated: a clear error, no sentinel.
	s := newStore(t, db)
	_, err := s.Acquire(t.Context(), req("k", "fp", long))
	if err == nil || !strings.Contains(err.Error(), "Migrate") {
		t.Errorf("Acquire before Migrate = %v, want a hint to migrate", err)
	}
	if _, err := s.Get(t.Context(), "tenant", "k"); err == nil || errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get before Migrate = %v", err)
	}
}

func TestSQLiteOpenRejects(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"", ":memory:", "file:x.db", "x.db?mode=ro"} {
		if db, err := sqlite.Open(t.Context(), p); err == nil {
			db.Close()
			t.Errorf("sqlite.Open(%q) succeeded", p)
		}
	}
}

func TestContextCanceled(t *testing.T) {
	t.Parallel()
	_, s := setup(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := s.Acquire(ctx, req("k", "fp", long))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire(canceled) = %v", err)
	}
	if _, err := s.Get(ctx, "tenant", "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Get(canceled) = %v", err)
	}
}
