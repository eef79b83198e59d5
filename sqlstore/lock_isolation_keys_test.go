package sqlstore_test

import (
	"fmt"
	"strings"
	"sync"
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
			errs := make(chan error, workers*per)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					<-start
					for i := range per {
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
							errs <- fmt.Errorf("%s: %w", name, err)
						}
					}
				})
			}
			close(start)
			wg.Wait()
			close(errs)
			var failed []string
			for err := range errs {
				failed = append(failed, err.Error())
			}
			if len(failed) > 0 {
				t.Fatalf("%d of %d distinct names failed:\n%s", len(failed), workers*per, strings.Join(failed, "\n"))
			}
			var n int
			if err := admin.QueryRowContext(ctx, `SELECT count(*) FROM idem_locks WHERE owner = '' AND fence = 1`).Scan(&n); err != nil || n != workers*per {
				t.Fatalf("%d released rows at fence 1, %v; want %d", n, err, workers*per)
			}
		})
	}
}
