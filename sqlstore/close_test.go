package sqlstore_test

import (
	"errors"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlstore"
)

// TestClose: Close closes the store's statements and nothing else; it is
// idempotent, and every call after it fails with sqlstore.ErrClosed.
func TestClose(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, s := srv.setup(t)
		ctx := t.Context()
		r := idem.AcquireRequest{Scope: randomName("close-"), Key: "k", Fingerprint: "fp", Lease: long, Retention: long}
		l := mustAcquire(t, s, r, idem.Acquired).Lease
		if _, err := s.Get(ctx, r.Scope, r.Key); err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if err := s.Close(); err != nil {
				t.Fatalf("Close #%d: %v", i+1, err)
			}
		}
		if err := db.PingContext(ctx); err != nil {
			t.Fatalf("the caller's *sql.DB after Close: %v", err)
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		calls := map[string]error{
			"Migrate":  s.Migrate(ctx),
			"Complete": s.Complete(ctx, l, idem.Response{StatusCode: 200}, long),
			"CompleteTx": func() error {
				return s.CompleteTx(ctx, tx, l, idem.Response{StatusCode: 200}, long)
			}(),
			"Release": s.Release(ctx, l),
			"Delete":  s.Delete(ctx, r.Scope, r.Key),
		}
		_, calls["Acquire"] = s.Acquire(ctx, r)
		_, calls["Extend"] = s.Extend(ctx, l, long)
		_, calls["Get"] = s.Get(ctx, r.Scope, r.Key)
		_, calls["Sweep"] = s.Sweep(ctx, 10)
		_, calls["CompleteRecord"] = s.CompleteRecord(ctx, l, idem.Response{StatusCode: 200}, long)
		for name, err := range calls {
			if !errors.Is(err, sqlstore.ErrClosed) {
				t.Errorf("%s after Close = %v, want sqlstore.ErrClosed", name, err)
			}
		}
		_ = tx.Rollback()
		// Nothing reached the database: the record is as it was.
		other, err := sqlstore.New(db, &sqlstore.Config{Dialect: srv.dialect})
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		if rec, err := other.Get(ctx, r.Scope, r.Key); err != nil || rec.Status != idem.StatusProcessing || rec.Owner != l.Owner {
			t.Fatalf("record after the refused calls = %+v, %v", rec, err)
		}
	})
}

// TestCloseDeallocates: on PostgreSQL, the statements a store prepared on
// a connection are gone from it after Close.
func TestCloseDeallocates(t *testing.T) {
	srv := servers[0]
	db, _ := srv.setup(t)
	db.SetMaxOpenConns(1) // one session, whose prepared statements the test lists
	ctx := t.Context()
	s, err := sqlstore.New(db, &sqlstore.Config{Dialect: srv.dialect})
	if err != nil {
		t.Fatal(err)
	}
	r := idem.AcquireRequest{Scope: randomName("dealloc-"), Key: "k", Fingerprint: "fp", Lease: long, Retention: long}
	l := mustAcquire(t, s, r, idem.Acquired).Lease
	if err := s.Complete(ctx, l, idem.Response{StatusCode: 200}, long); err != nil {
		t.Fatal(err)
	}
	count := func() (n int) {
		t.Helper()
		q := `SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%idem_records%' AND statement NOT LIKE '%pg_prepared_statements%'`
		if err := db.QueryRowContext(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n < 2 {
		t.Fatalf("%d statements prepared before Close, want the store's (at least 2)", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// database/sql closes a statement on an idle connection at once.
	if n := count(); n != 0 {
		t.Fatalf("%d of the store's statements still prepared after Close", n)
	}
}

// TestCloseConcurrent: calls racing with Close either succeed or fail
// with ErrClosed, and the statements they prepare meanwhile are closed.
func TestCloseConcurrent(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, _ := srv.setup(t)
		s, err := sqlstore.New(db, &sqlstore.Config{Dialect: srv.dialect})
		if err != nil {
			t.Fatal(err)
		}
		scope := randomName("closerace-")
		race(20, func(i int) {
			if i == 10 {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				return
			}
			r := idem.AcquireRequest{Scope: scope, Key: randomName("k"), Fingerprint: "fp", Lease: long, Retention: long}
			res, err := s.Acquire(t.Context(), r)
			if err == nil {
				err = s.Complete(t.Context(), res.Lease, idem.Response{StatusCode: 200}, long)
			}
			if err == nil {
				_, err = s.Get(t.Context(), r.Scope, r.Key)
			}
			if err != nil && !errors.Is(err, sqlstore.ErrClosed) {
				t.Errorf("call racing with Close: %v", err)
			}
		})
		if _, err := s.Get(t.Context(), scope, "k"); !errors.Is(err, sqlstore.ErrClosed) {
			t.Fatalf("Get after Close = %v", err)
		}
	})
}
