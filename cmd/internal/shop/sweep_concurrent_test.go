package shop_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/lock"
	"github.com/idemkit/idem/sqlstore"
)

// grantAll is a lock.Acquirer that grants every call, with a fence
// higher than the last: two passes run at once, as when a holder paused
// past its lease sweeps beside the next one.
type grantAll struct{ fence *atomic.Int64 }

func (g grantAll) TryAcquire(context.Context, string) (lock.Lease, error) {
	return grantedLease(g.fence.Add(1)), nil
}

func (g grantAll) Acquire(ctx context.Context, name string) (lock.Lease, error) {
	return g.TryAcquire(ctx, name)
}

// grantedLease is a lease that never ends.
type grantedLease int64

func (grantedLease) Name() string                  { return shop.CloseJobName }
func (grantedLease) Owner() string                 { return "grant-all" }
func (l grantedLease) Fence() int64                { return int64(l) }
func (grantedLease) Done() <-chan struct{}         { return nil }
func (grantedLease) Err() error                    { return nil }
func (grantedLease) Release(context.Context) error { return nil }
func (grantedLease) Context(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithCancel(parent)
}

// Two close jobs sweeping one database at once (a holder paused past its
// lease beside the next one) count every row they remove once:
// idem_swept_total moves by exactly the rows gone (4096, several
// statements' worth), whichever pass deleted them.
func TestCloseJobConcurrentSweepsCountEachRowOnce(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, srv, db := metricsShopOn(t, b)
		empty := "X''"
		if b.dialect == sqlstore.PostgreSQL {
			empty = "decode('', 'hex')"
		}
		mustExec(t, db, "INSERT INTO idem_outbox (topic, msg_key, payload, headers, created_at, sent_at) VALUES ('t', '', "+empty+", NULL, 1, 1)")
		for range 12 { // 4096 sent rows, long past the retention
			mustExec(t, db, "INSERT INTO idem_outbox (topic, msg_key, payload, headers, created_at, sent_at) SELECT topic, msg_key, payload, headers, created_at, sent_at FROM idem_outbox")
		}
		const rows = 4096
		var fence atomic.Int64
		fence.Store(1 << 40) // above any fence the job's row holds
		var wg sync.WaitGroup
		for range 2 {
			c, err := s.NewCloser(&shop.CloserConfig{Lock: grantAll{&fence}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			wg.Go(func() {
				for range 3 {
					if _, err := c.RunOnce(context.Background()); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		// A statement that lost its rows to the other pass's deletes fewer
		// than a batch and ends its pass early: passes alone finish.
		c, err := s.NewCloser(&shop.CloserConfig{Lock: grantAll{&fence}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for i := 0; i < 10 && countRows(t, db, `SELECT COUNT(*) FROM idem_outbox`) > 0; i++ {
			if _, err := c.RunOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		left := countRows(t, db, `SELECT COUNT(*) FROM idem_outbox`)
		var counted int
		for _, l := range scrape(t, srv) {
			if rest, ok := strings.CutPrefix(l, `idem_swept_total{store="`+b.dialect.String()+`",what="outbox"} `); ok {
				if counted, ok = atoi(rest); !ok {
					t.Fatalf("metric line %q", l)
				}
			}
		}
		if left != 0 || counted != rows-left {
			t.Fatalf("%d rows left of %d, idem_swept_total{what=outbox} %d; want every row swept and counted once", left, rows, counted)
		}
	})
}

func atoi(s string) (int, bool) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	return n, err == nil
}
