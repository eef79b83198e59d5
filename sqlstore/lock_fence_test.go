package sqlstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/lock"
)

// pausedBackend is a backend seen from a process that is paused: no
// renewal gets through (each waits for its context to end), as when a
// garbage collection, a suspended VM or a partition stops the watchdog.
type pausedBackend struct{ lock.Backend }

func (pausedBackend) Extend(ctx context.Context, _, _ string, _ int64, _ time.Duration) error {
	<-ctx.Done()
	return ctx.Err()
}

// resourceTable is the table a lock protects in the fencing tests: it
// refuses a write whose fence is not above the last one it accepted.
var resourceTable = map[string]string{
	"sqlite":   `CREATE TABLE resource (id INTEGER PRIMARY KEY, v TEXT NOT NULL, last_fence INTEGER NOT NULL)`,
	"postgres": `CREATE TABLE resource (id integer PRIMARY KEY, v text NOT NULL, last_fence bigint NOT NULL)`,
	"mysql":    `CREATE TABLE resource (id INT PRIMARY KEY, v VARCHAR(64) NOT NULL, last_fence BIGINT NOT NULL) ENGINE = InnoDB`,
}

// TestLockFencing shows the fence doing its job. Holder A acquires fence
// f and pauses past its lease; B acquires the lock (fence f+1) and writes
// the resource with
//
//	UPDATE resource SET v = ?, last_fence = ? WHERE id = ? AND last_fence < ?
//
// A wakes up and writes with f: 0 rows. The resource holds B's write, and
// A's lease has ended with ErrLost.
func TestLockFencing(t *testing.T) {
	t.Parallel()
	forDialects(t, func(t *testing.T, srv server) {
		ctx := t.Context()
		db, _ := lockDB(t, srv)
		if _, err := db.ExecContext(ctx, resourceTable[srv.dialect.String()]); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO resource (id, v, last_fence) VALUES (1, 'initial', 0)"); err != nil {
			t.Fatal(err)
		}
		write := func(v string, fence int64) int64 {
			t.Helper()
			res, err := db.ExecContext(ctx, srv.rebind("UPDATE resource SET v = ?, last_fence = ? WHERE id = ? AND last_fence < ?"), v, fence, 1, fence)
			if err != nil {
				t.Fatal(err)
			}
			n, err := res.RowsAffected()
			if err != nil {
				t.Fatal(err)
			}
			return n
		}

		b := newLockBackend(t, db, srv.dialect)
		lockerA, err := lock.New(pausedBackend{b}, &lock.Config{TTL: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		lockerB, err := lock.New(b, &lock.Config{TTL: time.Minute, RetryMin: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		a, err := lockerA.TryAcquire(ctx, "resource-1")
		if err != nil {
			t.Fatal(err)
		}
		// A is paused. B waits for the lock and writes.
		wait, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		bl, err := lockerB.Acquire(wait, "resource-1")
		if err != nil {
			t.Fatal(err)
		}
		defer bl.Release(ctx)
		if bl.Fence() <= a.Fence() {
			t.Fatalf("B's fence %d, want > A's %d", bl.Fence(), a.Fence())
		}
		if n := write("written by B", bl.Fence()); n != 1 {
			t.Fatalf("B's write: %d rows, want 1", n)
		}
		// A wakes up and writes with its stale fence: refused.
		if n := write("written by A", a.Fence()); n != 0 {
			t.Fatalf("A's write with the stale fence %d: %d rows, want 0", a.Fence(), n)
		}
		var v string
		var last int64
		if err := db.QueryRowContext(ctx, "SELECT v, last_fence FROM resource WHERE id = 1").Scan(&v, &last); err != nil {
			t.Fatal(err)
		}
		if v != "written by B" || last != bl.Fence() {
			t.Fatalf("resource = %q, last_fence %d; want B's write, %d", v, last, bl.Fence())
		}
		<-a.Done()
		if !errors.Is(a.Err(), lock.ErrLost) {
			t.Fatalf("A's lease: %v, want ErrLost", a.Err())
		}
		if err := a.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
			t.Fatalf("A's Release = %v, want ErrNotHeld", err)
		}
	})
}
