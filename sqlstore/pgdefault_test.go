package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/storetest"
)

// TestPostgresDefaultIsolationWrites: when the sessions of the store run
// REPEATABLE READ or SERIALIZABLE by default (default_transaction_isolation
// in the connection URL), a Complete, CompleteRecord, Release or Delete
// whose statement waits for a concurrent change of the record (here a
// takeover, written by hand in a transaction the test holds open) gets a
// serialization failure from PostgreSQL once that change commits. The
// store runs the statement again, with a new snapshot, as Extend does:
// the lease's operations answer idem.ErrLeaseLost, and Delete deletes.
func TestPostgresDefaultIsolationWrites(t *testing.T) {
	srv := servers[0]
	if srv.dialect != sqlstore.PostgreSQL {
		t.Fatal("servers[0] is not PostgreSQL")
	}
	admin, _ := srv.setup(t) // migrated
	for _, level := range []string{"repeatable read", "serializable"} {
		addr := srv.addrWith(t, func(q url.Values) { q.Set("default_transaction_isolation", level) }, nil)
		s, err := sqlstore.New(srv.open(t, addr), &sqlstore.Config{Dialect: srv.dialect})
		if err != nil {
			t.Fatal(err)
		}
		resp := idem.Response{StatusCode: 200, Body: []byte("late")}
		for _, op := range []struct {
			name string
			run  func(ctx context.Context, l idem.Lease) error
			want error // nil: success
		}{
			{"complete", func(ctx context.Context, l idem.Lease) error { return s.Complete(ctx, l, resp, long) }, idem.ErrLeaseLost},
			{"complete record", func(ctx context.Context, l idem.Lease) error {
				_, err := s.CompleteRecord(ctx, l, resp, long)
				return err
			}, idem.ErrLeaseLost},
			{"release", func(ctx context.Context, l idem.Lease) error { return s.Release(ctx, l) }, idem.ErrLeaseLost},
			{"delete", func(ctx context.Context, l idem.Lease) error { return s.Delete(ctx, l.Scope, l.Key) }, nil},
		} {
			t.Run(level+"/"+op.name, func(t *testing.T) {
				t.Parallel()
				ctx := t.Context()
				r := idem.AcquireRequest{Scope: randomName("pgdef-"), Key: "k", Fingerprint: "fp", Lease: long, Retention: long}
				l := mustAcquire(t, s, r, idem.Acquired).Lease
				// Another owner's takeover, in progress: it holds the row.
				tx, err := admin.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				if _, err := tx.ExecContext(ctx, `UPDATE idem_records SET owner = 'intruder', fence = fence + 1 WHERE scope = $1 AND idempotency_key = $2`, r.Scope, r.Key); err != nil {
					t.Fatal(err)
				}
				var pid int
				if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- op.run(ctx, l) }()
				// Wait until the operation's statement waits for the row.
				for {
					var n int
					if err := admin.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, pid).Scan(&n); err != nil {
						t.Fatal(err)
					}
					if n > 0 {
						break
					}
					select {
					case err := <-done:
						t.Fatalf("%s returned before the takeover committed: %v", op.name, err)
					case <-time.After(5 * time.Millisecond):
					}
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				err = <-done
				switch {
				case op.want == nil && err != nil, op.want != nil && !errors.Is(err, op.want):
					t.Fatalf("%s under %s racing a takeover = %v, want %v", op.name, level, err, op.want)
				}
				rec, err := s.Get(ctx, r.Scope, r.Key)
				switch {
				case op.want == nil && !errors.Is(err, idem.ErrNotFound):
					t.Fatalf("after Delete: %+v, %v; want no record", rec, err)
				case op.want != nil && (err != nil || rec.Owner != "intruder" || rec.Status != idem.StatusProcessing):
					t.Fatalf("record = %+v, %v; want the intruder's, processing", rec, err)
				}
			})
		}
	}
}

// TestPostgresDefaultIsolationConformance runs the conformance suite on a
// store whose sessions default to REPEATABLE READ, under which every
// statement of the store and of the suite's transactions takes one
// snapshot. (SERIALIZABLE as the sessions' default is not supported: see
// the package documentation.)
func TestPostgresDefaultIsolationConformance(t *testing.T) {
	srv := servers[0]
	srv.setup(t) // migrated
	addr := srv.addrWith(t, func(q url.Values) { q.Set("default_transaction_isolation", "repeatable read") }, nil)
	db := srv.open(t, addr)
	s, err := sqlstore.New(db, &sqlstore.Config{Dialect: srv.dialect})
	if err != nil {
		t.Fatal(err)
	}
	storetest.Run(t, func(*testing.T) idem.Store { return s }, storetest.Caps{
		BeginTx:   func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
		Precision: time.Millisecond,
	})
}
