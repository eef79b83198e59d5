package sqlstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/lock"
	"github.com/idemkit/idem/lock/locktest"
	"github.com/idemkit/idem/sqlstore"
)

// TestLockPostgresDefaultIsolation: when the backend's sessions run
// REPEATABLE READ or SERIALIZABLE by default, an Extend or a Release whose
// statement waits for a takeover in progress (written by hand in a
// transaction the test holds open) answers lock.ErrNotHeld once the
// takeover commits, not the serialisation failure PostgreSQL reports to a
// statement whose row changed after its snapshot; and the conformance
// suite holds.
func TestLockPostgresDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			db, admin := pgIsolationDB(t, level)
			b := newLockBackend(t, db, sqlstore.PostgreSQL)
			ops := []struct {
				name string
				run  func(ctx context.Context, name, owner string, fence int64) error
			}{
				{"extend", func(ctx context.Context, name, owner string, fence int64) error {
					return b.Extend(ctx, name, owner, fence, time.Minute)
				}},
				{"release", b.Release},
			}
			for _, op := range ops {
				ctx := t.Context()
				name := randomName("iso-" + op.name + "-")
				owner := lock.NewOwner()
				fence, err := b.Acquire(ctx, name, owner, time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				tx, err := admin.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				if _, err := tx.ExecContext(ctx, `UPDATE idem_locks SET owner = 'intruder', fence = fence + 1 WHERE name = $1`, name); err != nil {
					t.Fatal(err)
				}
				var pid int
				if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- op.run(ctx, name, owner, fence) }()
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
				if err := <-done; !errors.Is(err, lock.ErrNotHeld) {
					t.Errorf("%s racing a takeover = %v, want lock.ErrNotHeld", op.name, err)
				} else {
					t.Logf("%s racing a takeover: %v", op.name, err)
				}
				var rowOwner string
				var rowFence int64
				if err := admin.QueryRowContext(ctx, `SELECT owner, fence FROM idem_locks WHERE name = $1`, name).Scan(&rowOwner, &rowFence); err != nil {
					t.Fatal(err)
				}
				if rowOwner != "intruder" || rowFence != fence+1 {
					t.Errorf("after %s: row (%q, %d), want the intruder's (fence %d)", op.name, rowOwner, rowFence, fence+1)
				}
			}
			locktest.Run(t, func(*testing.T) lock.Backend { return b })
		})
	}
}
