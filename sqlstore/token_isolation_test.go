package sqlstore_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/token"
	"github.com/idemkit/idem/token/tokentest"
)

// pgIsolationDB returns a PostgreSQL schema of the test's own, migrated,
// and a pool on it whose sessions run level by default
// (default_transaction_isolation), and the admin pool (READ COMMITTED).
func pgIsolationDB(t *testing.T, level string) (db, admin *sql.DB) {
	t.Helper()
	admin, dsn := testdb.Postgres(t)
	db, _ = testdb.AtIsolation(t, dsn, level)
	s, err := sqlstore.New(admin, &sqlstore.Config{Dialect: sqlstore.PostgreSQL})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return db, admin
}

// TestTokenPostgresDefaultIsolation: when the store's sessions run
// REPEATABLE READ or SERIALIZABLE by default, the conformance suite holds
// (ConsumeTx in READ COMMITTED transactions: under SERIALIZABLE, see
// TokenStore.ConsumeTx), and an Insert whose digest a concurrent
// transaction is inserting answers token.ErrDuplicate once that
// transaction commits, not the serialisation failure PostgreSQL reports
// to a statement whose snapshot predates the conflicting row.
func TestTokenPostgresDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			db, admin := pgIsolationDB(t, level)
			s := newTokenStore(t, db, sqlstore.PostgreSQL)
			ctx := t.Context()

			// The race, made certain: the other transaction's row is there
			// (uncommitted) before the Insert begins.
			for _, commit := range []bool{true, false} {
				sum := sha256.Sum256([]byte(randomName("race-")))
				d := hex.EncodeToString(sum[:])
				tx, err := admin.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tx.ExecContext(ctx, `INSERT INTO idem_tokens (digest, scope, created_at, expires_at)
					VALUES ($1, 'other', 0, 9000000000000)`, d); err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() {
					_, err := s.Insert(ctx, "u", d, time.Minute)
					done <- err
				}()
				waitForLockWait(t, admin)
				if commit {
					err = tx.Commit()
				} else {
					err = tx.Rollback()
				}
				if err != nil {
					t.Fatal(err)
				}
				err = <-done
				var scope string
				if qerr := admin.QueryRowContext(ctx, "SELECT scope FROM idem_tokens WHERE digest = $1", d).Scan(&scope); qerr != nil {
					t.Fatal(qerr)
				}
				switch {
				case commit && (err != token.ErrDuplicate || scope != "other"):
					t.Errorf("Insert racing a committed insert = %v (row's scope %q), want token.ErrDuplicate and the other's row", err, scope)
				case !commit && (err != nil || scope != "u"):
					t.Errorf("Insert racing a rolled back insert = %v (row's scope %q), want nil and its row", err, scope)
				}
			}

			tokentest.Run(t, func(*testing.T) token.Store { return s }, tokentest.Caps{
				BeginTx: func(ctx context.Context) (*sql.Tx, error) {
					return db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
				},
				Precision: time.Millisecond,
			})
		})
	}
}

// waitForLockWait returns once a session of the test database waits for
// a lock (a transaction id: a row another transaction writes).
func waitForLockWait(t *testing.T, admin *sql.DB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := admin.QueryRowContext(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%idem_tokens%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no session waits for the row")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
