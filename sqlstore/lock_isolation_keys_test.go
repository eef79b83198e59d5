package sqlstore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/lock"
	"github.com/idemkit/idem/sqlstore"
)

// TestLockDistinctNamesUnderIsolationDefault: the lock backend's
// statements on distinct names never fail each other, whatever isolation
// the sessions default to (as TestDistinctKeysUnderIsolationDefault for
// the store): many goroutines acquire, extend and release names of their
// own on a fresh idem_locks; every call succeeds and every row ends
// released with fence 1.
func TestLockDistinctNamesUnderIsolationDefault(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			db, admin := pgIsolationDB(t, level)
			b := newLockBackend(t, db, sqlstore.PostgreSQL)
			ctx := t.Context()
			const workers, per = 24, 8
			concurrently(t, workers, per, "distinct names", func(w, i int) error {
				name := fmt.Sprintf("n-%02d-%02d", w, i)
				owner := lock.NewOwner()
				fence, err := b.Acquire(ctx, name, owner, time.Minute)
				if err == nil {
					err = b.Extend(ctx, name, owner, fence, time.Minute)
				}
				if err == nil {
					err = b.Release(ctx, name, owner, fence)
				}
				if err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
				return nil
			})
			var n int
			if err := admin.QueryRowContext(ctx, `SELECT count(*) FROM idem_locks WHERE owner = '' AND fence = 1`).Scan(&n); err != nil || n != workers*per {
				t.Fatalf("%d released rows at fence 1, %v; want %d", n, err, workers*per)
			}
		})
	}
}
