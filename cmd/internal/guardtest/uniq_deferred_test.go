package guardtest_test

import (
	"context"
	"testing"

	"github.com/idemkit/idem/uniq"
)

// TestInsertOrGetDeferredUnique: a PostgreSQL unique constraint that is
// DEFERRABLE INITIALLY DEFERRED is checked at COMMIT, not by the INSERT.
// On a *sql.DB the statement commits at once, so the duplicate is met by
// the insert and read back. In a transaction the insert succeeds, and the
// COMMIT fails with the duplicate, as uniq's documentation says; with
// SET CONSTRAINTS … IMMEDIATE first, the duplicate is met by the insert.
func TestInsertOrGetDeferredUnique(t *testing.T) {
	t.Parallel()
	for _, s := range servers[:2] {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db := s.open(t)
			ctx := context.Background()
			execAll(t, db,
				`CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, ref TEXT NOT NULL, email TEXT, amount INT NOT NULL,
					CONSTRAINT orders_ref UNIQUE (ref) DEFERRABLE INITIALLY DEFERRED)`)
			first, created, err := uniq.InsertOrGet(ctx, db, insertOrder(postgres, "d-1", "", 1), getOrder(postgres, "d-1"))
			if err != nil || !created {
				t.Fatalf("first: %+v %v %v", first, created, err)
			}
			again, created, err := uniq.InsertOrGet(ctx, db, insertOrder(postgres, "d-1", "", 2), getOrder(postgres, "d-1"))
			if err != nil || created || again != first {
				t.Errorf("second on a DB: %+v, created %v, %v; want the first row %+v", again, created, err, first)
			}

			// In a transaction: checked at COMMIT.
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, created, err = uniq.InsertOrGet(ctx, tx, insertOrder(postgres, "d-1", "", 3), getOrder(postgres, "d-1"))
			if err != nil || !created {
				t.Fatalf("in a tx: created %v, %v; the documentation says the insert succeeds", created, err)
			}
			if err := tx.Commit(); !uniq.IsDuplicate(err) {
				t.Fatalf("commit: %v; want the deferred duplicate", err)
			}

			// SET CONSTRAINTS … IMMEDIATE: the insert meets it.
			tx, err = db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if _, err := tx.ExecContext(ctx, `SET CONSTRAINTS orders_ref IMMEDIATE`); err != nil {
				t.Fatal(err)
			}
			again, created, err = uniq.InsertOrGet(ctx, tx, insertOrder(postgres, "d-1", "", 4), getOrder(postgres, "d-1"))
			if err != nil || created || again != first {
				t.Errorf("in a tx after SET CONSTRAINTS: %+v, created %v, %v; want the first row %+v", again, created, err, first)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if n := count(t, db, postgres, `SELECT COUNT(*) FROM orders`); n != 1 {
				t.Errorf("%d rows", n)
			}
		})
	}
}
