package sqlstore_test

import (
	"database/sql"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlstore"
)

// isolationLevels are the levels a business transaction may use.
var isolationLevels = []sql.IsolationLevel{sql.LevelReadUncommitted, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable}

// TestCompleteTxIsolation runs the flow of a guard under each isolation
// level: acquire, begin the business transaction, write the effect,
// renew the lease from outside the transaction several times, complete
// in the transaction, commit. The completion must succeed and commit with
// the effect. SQLite runs one writer at a time: the renewals run before
// the transaction, which holds the write lock from BEGIN.
func TestCompleteTxIsolation(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, s := srv.setup(t)
		srv.table(t, db, "idem_test_orders")
		for _, level := range isolationLevels {
			t.Run(level.String(), func(t *testing.T) {
				t.Parallel()
				ctx := t.Context()
				scope := randomName("iso-")
				l := mustAcquire(t, s, idem.AcquireRequest{Scope: scope, Key: "k", Fingerprint: "fp", Lease: long, Retention: long}, idem.Acquired).Lease
				renew := func() {
					t.Helper()
					for range 3 {
						ext, err := s.Extend(ctx, l, long)
						if err != nil {
							t.Fatalf("Extend: %v", err)
						}
						l.Until = ext.Until
						time.Sleep(2 * time.Millisecond) // each renewal at another millisecond
					}
				}
				if srv.dialect == sqlstore.SQLite {
					renew()
				}
				tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				srv.business(t, tx, scope)
				if srv.dialect != sqlstore.SQLite {
					renew()
				}
				if err := s.CompleteTx(ctx, tx, l, idem.Response{StatusCode: 201, Body: []byte("paid")}, long); err != nil {
					t.Fatalf("CompleteTx under %v after renewals: %v", level, err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatalf("Commit: %v", err)
				}
				checkCompletedBy(t, s, l, "paid")
				if n := srv.businessRows(t, db, scope); n != 1 {
					t.Fatalf("%d business rows, want 1", n)
				}
				if rec, err := s.Get(ctx, scope, "k"); err != nil || !rec.LeaseUntil.Before(rec.CompletedAt.Add(long+time.Second)) {
					t.Fatalf("completed record %+v, %v", rec, err)
				}
			})
		}
	})
}

// TestCompleteTxIsolationTakeover: a takeover while the business
// transaction runs makes CompleteTx fail with idem.ErrLeaseLost under
// every isolation level, and the effect is not committed. (SQLite is not
// in this test: its business transaction holds the write lock from BEGIN,
// so no takeover can happen while it runs.)
func TestCompleteTxIsolationTakeover(t *testing.T) {
	forServers(t, func(t *testing.T, srv server) {
		db, s := srv.setup(t)
		srv.table(t, db, "idem_test_orders")
		for _, level := range isolationLevels {
			t.Run(level.String(), func(t *testing.T) {
				t.Parallel()
				ctx := t.Context()
				r := idem.AcquireRequest{Scope: randomName("isotake-"), Key: "k", Fingerprint: "fp", Lease: short, Retention: long}
				stale := mustAcquire(t, s, r, idem.Acquired).Lease
				if _, err := s.Extend(ctx, stale, short); err != nil {
					t.Fatal(err)
				}
				tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				srv.business(t, tx, r.Scope)
				time.Sleep(short + 20*time.Millisecond)
				r.Lease = long
				won := mustAcquire(t, s, r, idem.Acquired)
				if !won.TookOver {
					t.Fatalf("the second Acquire did not take over: %+v", won)
				}
				err = s.CompleteTx(ctx, tx, stale, idem.Response{StatusCode: 201, Body: []byte("stale")}, long)
				if !errors.Is(err, idem.ErrLeaseLost) {
					t.Fatalf("CompleteTx under %v after a takeover = %v, want idem.ErrLeaseLost", level, err)
				}
				_ = tx.Rollback()
				if n := srv.businessRows(t, db, r.Scope); n != 0 {
					t.Fatalf("%d business rows after the refused completion, want 0", n)
				}
				rec, err := s.Get(ctx, r.Scope, r.Key)
				if err != nil || rec.Status != idem.StatusProcessing || rec.Owner != won.Lease.Owner || rec.Fence != won.Lease.Fence {
					t.Fatalf("record after the refused completion = %+v, %v; want the winner's", rec, err)
				}
				if err := s.Complete(ctx, won.Lease, idem.Response{StatusCode: 200}, long); err != nil {
					t.Fatalf("the winner's Complete: %v", err)
				}
			})
		}
	})
}

// TestCompleteTxIsolationDefault: the same flow when the server's
// default_transaction_isolation is REPEATABLE READ or SERIALIZABLE, so
// that the store's own statements run under it too (PostgreSQL).
func TestCompleteTxIsolationDefault(t *testing.T) {
	srv := servers[0]
	if srv.dialect != sqlstore.PostgreSQL {
		t.Fatal("servers[0] is not PostgreSQL")
	}
	srv.setup(t) // migrated
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			addr := srv.addrWith(t, func(q url.Values) { q.Set("default_transaction_isolation", level) }, nil)
			db := srv.open(t, addr)
			s, err := sqlstore.New(db, &sqlstore.Config{Dialect: srv.dialect})
			if err != nil {
				t.Fatal(err)
			}
			srv.table(t, db, "idem_test_orders")
			ctx := t.Context()
			scope := randomName("isodef-")
			l := mustAcquire(t, s, idem.AcquireRequest{Scope: scope, Key: "k", Fingerprint: "fp", Lease: long, Retention: long}, idem.Acquired).Lease
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			srv.business(t, tx, scope)
			for range 3 {
				if _, err := s.Extend(ctx, l, long); err != nil {
					t.Fatalf("Extend: %v", err)
				}
				time.Sleep(2 * time.Millisecond)
			}
			if err := s.CompleteTx(ctx, tx, l, idem.Response{StatusCode: 201, Body: []byte("paid")}, long); err != nil {
				t.Fatalf("CompleteTx: %v", err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			checkCompletedBy(t, s, l, "paid")
			if n := srv.businessRows(t, db, scope); n != 1 {
				t.Fatalf("%d business rows, want 1", n)
			}
		})
	}
}

// TestCompleteTxIsolationCompleted: when the execution's own completion
// committed while its business transaction ran (a retry outside the
// transaction, say), CompleteTx fails with idem.ErrFinished under every
// isolation level, and the effect is not committed a second time.
func TestCompleteTxIsolationCompleted(t *testing.T) {
	forServers(t, func(t *testing.T, srv server) {
		db, s := srv.setup(t)
		srv.table(t, db, "idem_test_orders")
		for _, level := range isolationLevels {
			t.Run(level.String(), func(t *testing.T) {
				t.Parallel()
				ctx := t.Context()
				r := idem.AcquireRequest{Scope: randomName("isodone-"), Key: "k", Fingerprint: "fp", Lease: long, Retention: long}
				l := mustAcquire(t, s, r, idem.Acquired).Lease
				tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				srv.business(t, tx, r.Scope)
				// A read in tx: under REPEATABLE READ it fixes tx's snapshot
				// (MySQL takes it at the first read).
				var n int
				if err := tx.QueryRowContext(ctx, srv.rebind(`SELECT count(*) FROM idem_test_orders WHERE id = ?`), r.Scope).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if err := s.Complete(ctx, l, idem.Response{StatusCode: 201, Body: []byte("first")}, long); err != nil {
					t.Fatal(err)
				}
				err = s.CompleteTx(ctx, tx, l, idem.Response{StatusCode: 201, Body: []byte("second")}, long)
				if !errors.Is(err, idem.ErrFinished) {
					t.Fatalf("CompleteTx under %v of a record its lease completed meanwhile = %v, want idem.ErrFinished", level, err)
				}
				_ = tx.Rollback()
				checkCompletedBy(t, s, l, "first")
				if n := srv.businessRows(t, db, r.Scope); n != 0 {
					t.Fatalf("%d business rows, want 0", n)
				}
			})
		}
	})
}
