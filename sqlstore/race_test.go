package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlstore"
)

// race runs f(i) for i in [0, n) on n goroutines released at once.
func race(n int, f func(i int)) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			f(i)
		})
	}
	close(start)
	wg.Wait()
}

func isLocked(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "database is locked") || strings.Contains(err.Error(), "SQLITE_BUSY"))
}

// TestCompleteTxUnderLoad: 50 goroutines each run a business transaction
// (insert a row, CompleteTx, commit) on keys of their own, while 20 others
// acquire, extend and complete keys outside any transaction. No call may
// fail with "database is locked", and every business row and every
// completion must be there afterwards.
func TestCompleteTxUnderLoad(t *testing.T) {
	t.Parallel()
	db, s := setup(t)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, amount INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var failures atomic.Int64
	var firstErr atomic.Value
	fail := func(err error) {
		if failures.Add(1) == 1 {
			firstErr.Store(err)
		}
	}
	stop := make(chan struct{})
	var background sync.WaitGroup
	for w := range 20 {
		background.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				res, err := s.Acquire(ctx, req(fmt.Sprintf("bg-%d-%d", w, i), "fp", long))
				if err != nil {
					fail(err)
					continue
				}
				l, err := s.Extend(ctx, res.Lease, long)
				if err != nil {
					fail(err)
					continue
				}
				if err := s.Complete(ctx, l, idem.Response{StatusCode: 200}, long); err != nil {
					fail(err)
				}
			}
		})
	}

	race(50, func(i int) {
		key := fmt.Sprintf("order-%d", i)
		res, err := s.Acquire(ctx, req(key, "fp", long))
		if err != nil {
			fail(err)
			return
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			fail(err)
			return
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, amount) VALUES (?, ?)`, key, i); err != nil {
			fail(err)
			return
		}
		if err := s.CompleteTx(ctx, tx, res.Lease, idem.Response{StatusCode: 201, Body: []byte(key)}, long); err != nil {
			fail(err)
			return
		}
		if err := tx.Commit(); err != nil {
			fail(err)
		}
	})
	close(stop)
	background.Wait()

	if n := failures.Load(); n > 0 {
		err := firstErr.Load().(error)
		t.Fatalf("%d calls failed (database is locked: %v); first: %v", n, isLocked(err), err)
	}
	var orders int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&orders); err != nil || orders != 50 {
		t.Fatalf("orders = %d, %v; want 50", orders, err)
	}
	for i := range 50 {
		rec, err := s.Get(ctx, "tenant", fmt.Sprintf("order-%d", i))
		if err != nil || rec.Status != idem.StatusCompleted || string(rec.Response.Body) != fmt.Sprintf("order-%d", i) {
			t.Fatalf("order-%d: %+v, %v", i, rec, err)
		}
	}
}

// TestGuardCompleteTxWithWatchdog runs the shop's pattern through the
// Guard: each execution's watchdog renews the lease (every 40 ms) while
// handlers hold write transactions that end with CompleteTx. Each payment
// happens exactly once, no call fails with "database is locked", and no
// execution loses its lease.
//
// The last point holds because Execution.CompleteTx cancels a renewal in
// progress: on SQLite that renewal waits for the write lock (and, under
// sqlite.Open, the one connection) that the handler's own transaction
// holds. A watchdog that waited for its renewal instead stalled each such
// handler for Lease/3 with the lock held, and lost 13 to 27 leases of 30
// in this test (then with a 120 ms lease). Executions that fail are
// retried, so that the exactly-once check holds either way.
func TestGuardCompleteTxWithWatchdog(t *testing.T) {
	t.Parallel()
	db, s := setup(t)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE payments (id TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	// The lease is long enough for 30 serialised commits on a slow, loaded
	// disk (120 ms lost up to 21 of 30 legitimately under the race
	// detector, 400 ms up to 20 when other test processes shared the two
	// cores, now that the watchdog gives a lease up at its end even while
	// a renewal waits for the connection; 1 s still lost 14 of 30 once, on
	// a loaded machine), and short enough that a completion stalled
	// Lease/3 behind each renewal (30 × 1 s) would lose most of them.
	const lease = 3 * time.Second
	g, err := idem.NewGuard(s, &idem.GuardConfig{Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	pay := func(key string) error {
		_, _, err := g.Do(ctx, "tenant", key, "fp", func(ctx context.Context) (idem.Response, error) {
			runs.Add(1)
			time.Sleep(lease/3 + 20*time.Millisecond) // outside the transaction: the watchdog renews meanwhile
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return idem.Response{}, err
			}
			defer tx.Rollback()
			if _, err := tx.ExecContext(ctx, `INSERT INTO payments (id) VALUES (?)`, key); err != nil {
				return idem.Response{}, err
			}
			resp := idem.Response{StatusCode: 200, Body: []byte(key)}
			if err := idem.FromContext(ctx).CompleteTx(ctx, tx, resp); err != nil {
				return idem.Response{}, err
			}
			return resp, tx.Commit()
		})
		return err
	}
	started := time.Now()
	var mu sync.Mutex
	failed := map[string]error{}
	race(30, func(i int) {
		key := fmt.Sprintf("pay-%d", i)
		if err := pay(key); err != nil {
			mu.Lock()
			failed[key] = err
			mu.Unlock()
		}
	})
	lost := len(failed)
	for key, err := range failed {
		if isLocked(err) || !errors.Is(err, context.Canceled) {
			t.Errorf("%s: %v; want only lease losses (context canceled)", key, err)
		}
	}
	time.Sleep(lease + 50*time.Millisecond) // let the lost leases run out
	for key := range failed {
		if err := pay(key); err != nil {
			t.Errorf("retry of %s: %v", key, err)
		}
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM payments`).Scan(&n); err != nil || n != 30 {
		t.Fatalf("payments = %d, %v; want 30", n, err)
	}
	for i := range 30 {
		if rec, err := s.Get(ctx, "tenant", fmt.Sprintf("pay-%d", i)); err != nil || rec.Status != idem.StatusCompleted {
			t.Fatalf("pay-%d: %+v, %v", i, rec, err)
		}
	}
	// Under load (the race detector, parallel tests) a renewal can wait
	// for the one connection past the lease, so a few losses are
	// legitimate: the checks above hold regardless. A completion that
	// stalls behind a blocked renewal (the regression this guards) lost
	// 13 to 27 of 30.
	if lost > 10 {
		t.Errorf("%d executions of 30 lost their lease (%d runs in all)", lost, runs.Load())
	}
	t.Logf("30 payments, %d runs, %v", runs.Load(), time.Since(started))
}

// TestMigrate: Migrate is idempotent, safe from many goroutines and
// handles at once, and records the schema version.
func TestMigrate(t *testing.T) {
	t.Parallel()
	path := t.TempDir() + "/m.db"
	var dbs []*sql.DB
	for range 4 {
		dbs = append(dbs, openDB(t, path))
	}
	var errs atomic.Int64
	race(16, func(i int) {
		if err := newStore(t, dbs[i%len(dbs)]).Migrate(context.Background()); err != nil {
			t.Errorf("Migrate %d: %v", i, err)
			errs.Add(1)
		}
	})
	s := newStore(t, dbs[0])
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	rows, err := dbs[1].QueryContext(t.Context(), `SELECT version, name, applied_at FROM idem_schema_migrations ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var versions []string
	for rows.Next() {
		var v, at int64
		var name string
		if err := rows.Scan(&v, &name, &at); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(time.UnixMilli(at)); d < 0 || d > time.Minute {
			t.Errorf("version %d applied_at %v", v, time.UnixMilli(at))
		}
		versions = append(versions, fmt.Sprintf("%d_%s", v, name))
	}
	if want := sqlstore.MigrationNames(sqlstore.SQLite); strings.Join(versions, ",") != strings.Join(want, ",") {
		t.Fatalf("recorded versions = %v, want %v", versions, want)
	}
	mustAcquire(t, s, req("k", "fp", long), idem.Acquired)
}

// TestMigrateUpgrade: a SQLite database an older build migrated to
// version 1, with records it wrote, is brought up to date by Migrate;
// until then Acquire says to migrate.
func TestMigrateUpgrade(t *testing.T) {
	t.Parallel()
	db := openDB(t, t.TempDir()+"/old.db")
	s := newStore(t, db)
	ctx := t.Context()
	if err := sqlstore.MigrateTo(ctx, s, 1); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	if _, err := db.ExecContext(ctx, `INSERT INTO idem_records (scope, idempotency_key, fingerprint, status, owner, fence, lease_until, retention_ms, created_at, expires_at)
		VALUES ('tenant', 'ended', 'fp', 'processing', 'old-owner', 2, ?1, 60000, ?2, ?1 + 60000)`, now-1000, now-5000); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, req("new", "fp", long)); err == nil || !strings.Contains(err.Error(), "Migrate") {
		t.Errorf("Acquire on a version-1 database = %v, want a hint to migrate", err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	res := mustAcquire(t, s, req("ended", "fp", long), idem.Acquired)
	if !res.TookOver || res.Lease.Fence != 3 || !res.Record.CreatedAt.Equal(time.UnixMilli(now-5000)) {
		t.Fatalf("takeover of the older build's ended lease: %+v", res)
	}
	mustAcquire(t, s, req("new", "fp", long), idem.Acquired)
}
