package sqlstore_test

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlstore"
)

// setupTwo opens the server's test database twice, as two *sql.DB, and
// returns both with a migrated store on the first.
func (srv server) setupTwo(t *testing.T) (db, other *sql.DB, s *sqlstore.Store) {
	t.Helper()
	if srv.dialect == sqlstore.SQLite {
		path := filepath.Join(t.TempDir(), "idem.db")
		db, other = openDB(t, path), openDB(t, path)
		s = newStore(t, db)
		if err := s.Migrate(t.Context()); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
		return db, other, s
	}
	db, s = srv.setup(t)
	return db, srv.open(t, ""), s
}

// business inserts the business row id in tx.
func (srv server) business(t *testing.T, tx *sql.Tx, id string) {
	t.Helper()
	if _, err := tx.ExecContext(t.Context(), srv.rebind(`INSERT INTO idem_test_orders (id, amount) VALUES (?, 1)`), id); err != nil {
		t.Fatalf("business insert: %v", err)
	}
}

// businessRows counts the business rows id.
func (srv server) businessRows(t *testing.T, db *sql.DB, id string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), srv.rebind(`SELECT count(*) FROM idem_test_orders WHERE id = ?`), id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// checkCompletedBy fails t unless the record of l is completed by l with
// resp's body.
func checkCompletedBy(t *testing.T, s *sqlstore.Store, l idem.Lease, body string) {
	t.Helper()
	rec, err := s.Get(t.Context(), l.Scope, l.Key)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if rec.Status != idem.StatusCompleted || rec.Owner != l.Owner || rec.Fence != l.Fence || rec.Response == nil || string(rec.Response.Body) != body {
		t.Fatalf("record = %+v, want completed by fence %d with body %q", rec, l.Fence, body)
	}
}

// TestCompleteTxOtherDB: CompleteTx works with a transaction of any
// *sql.DB on the store's database, also after Complete has prepared and
// cached the store's own statement.
func TestCompleteTxOtherDB(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, other, s := srv.setupTwo(t)
		srv.table(t, db, "idem_test_orders")
		ctx := t.Context()
		scope := randomName("otherdb-")
		r := idem.AcquireRequest{Scope: scope, Fingerprint: "fp", Lease: long, Retention: long}
		for _, key := range []string{"cold", "warm"} {
			r.Key = key
			l := mustAcquire(t, s, r, idem.Acquired).Lease
			tx, err := other.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			srv.business(t, tx, scope+key)
			if err := s.CompleteTx(ctx, tx, l, idem.Response{StatusCode: 201, Body: []byte(key)}, long); err != nil {
				_ = tx.Rollback()
				t.Fatalf("CompleteTx (%s) with a transaction of another *sql.DB: %v", key, err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			checkCompletedBy(t, s, l, key)
			if n := srv.businessRows(t, db, scope+key); n != 1 {
				t.Fatalf("%d business rows after the commit, want 1", n)
			}
			// Complete caches the store's statement for the next round.
			r.Key = key + "-plain"
			pl := mustAcquire(t, s, r, idem.Acquired).Lease
			if err := s.Complete(ctx, pl, idem.Response{StatusCode: 200}, long); err != nil {
				t.Fatal(err)
			}
		}
	})
}
