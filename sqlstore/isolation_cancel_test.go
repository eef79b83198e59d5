package sqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/sqlstore"
)

// TestWrappedCancelled: on sessions defaulting to SERIALIZABLE (own
// statements in READ COMMITTED transactions of their own), calls whose
// ctx ends at any point — before BEGIN, between BEGIN and the statement,
// between the statement and COMMIT — fail with an error matching
// context.Canceled or succeed; none leaks a connection, and the store
// still works on every key afterwards.
func TestWrappedCancelled(t *testing.T) {
	db, _ := testdb.PostgresAt(t, "serializable")
	s, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.PostgreSQL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	const workers, per = 16, 20
	var wg sync.WaitGroup
	errs := make(chan error, workers*per)
	for w := range workers {
		wg.Go(func() {
			for i := range per {
				cctx, cancel := context.WithCancel(ctx)
				// Cancel at spread-out moments of the call.
				time.AfterFunc(time.Duration((w*per+i)%40)*50*time.Microsecond, cancel)
				req := idem.AcquireRequest{Scope: "cancel", Key: fmt.Sprintf("k-%d-%d", w, i), Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
				res, err := s.Acquire(cctx, req)
				if err == nil && res.Outcome == idem.Acquired {
					err = s.Complete(cctx, res.Lease, idem.Response{StatusCode: 200}, time.Hour)
				}
				if err != nil && !errors.Is(err, context.Canceled) {
					errs <- fmt.Errorf("%s: %w", req.Key, err)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// database/sql rolls a cancelled transaction back on a goroutine of
	// its own: wait for the connections to come back.
	obstest.WaitFor(t, "every connection back in the pool", func() bool { return db.Stats().InUse == 0 })
	distinctKeys(t, s, "after-cancel")
}
