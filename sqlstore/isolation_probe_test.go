package sqlstore_test

import (
	"context"
	"testing"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/sqlstore"
)

// TestIsolationDefaultChangedAfterProbe: the store asks the default
// isolation once, on one connection of the pool; sessions that run at
// SERIALIZABLE afterwards (the database's default changed, new
// connections pick it up; or a SET SESSION CHARACTERISTICS that a caller
// ran on *sql.DB, which lands on whichever pooled connection) must not
// bring back the failures of distinct keys that READ COMMITTED avoids:
// the first serialisation failure of one of its own statements proves
// the session above READ COMMITTED, and the store then wraps them.
func TestIsolationDefaultChangedAfterProbe(t *testing.T) {
	db, _ := testdb.Postgres(t)
	db.SetMaxIdleConns(8) // keep the sessions set below
	ctx := t.Context()
	s, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.PostgreSQL})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := acquireComplete(ctx, s, "probe", "first"); err != nil {
		t.Fatal(err)
	}
	if rc, known := sqlstore.OwnStatementsInReadCommitted(s); !known || rc {
		t.Fatalf("after the first statement at READ COMMITTED: wrapped %v known %v, want alone", rc, known)
	}
	// Every connection of the pool (8, testdb.Open) now defaults to
	// SERIALIZABLE.
	var conns []interface{ Close() error }
	for range 8 {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.ExecContext(ctx, "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE"); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Close()
	}
	var level string
	if err := db.QueryRowContext(context.Background(), "SHOW transaction_isolation").Scan(&level); err != nil || level != "serializable" {
		t.Fatalf("transaction_isolation = %q, %v", level, err)
	}
	distinctKeys(t, s, "iso-later")
	if rc, known := sqlstore.OwnStatementsInReadCommitted(s); !known || !rc {
		t.Fatalf("after serialisation failures: wrapped %v known %v, want wrapped", rc, known)
	}
}
