package sqlstore_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/lock"
	"github.com/idemkit/idem/sqlstore"
)

// Environment of a TestLockMultiProcess child.
const (
	envLockChildDialect = "SQLSTORE_TEST_LOCK_CHILD_DIALECT"
	envLockChildDSN     = "SQLSTORE_TEST_LOCK_CHILD_DSN"
	envLockChildStart   = "SQLSTORE_TEST_LOCK_CHILD_START"
)

const (
	lockProcesses  = 3
	lockGoroutines = 4
	lockRounds     = 5
	lockName       = "contended"
)

var lockLogTable = map[string][]string{
	"postgres": {
		`CREATE TABLE lock_log (seq bigserial PRIMARY KEY, fence bigint NOT NULL UNIQUE, owner text NOT NULL)`,
		`CREATE TABLE lock_counter (id integer PRIMARY KEY, n bigint NOT NULL, last_fence bigint NOT NULL)`,
	},
	"mysql": {
		`CREATE TABLE lock_log (seq BIGINT AUTO_INCREMENT PRIMARY KEY, fence BIGINT NOT NULL UNIQUE, owner VARCHAR(64) NOT NULL) ENGINE = InnoDB`,
		`CREATE TABLE lock_counter (id INT PRIMARY KEY, n BIGINT NOT NULL, last_fence BIGINT NOT NULL) ENGINE = InnoDB`,
	},
}

// TestLockMultiProcess re-executes the test binary: 3 processes × 4
// goroutines each acquire one lock name 5 times with a Locker. Inside its
// critical section each holder inserts (fence, owner) into lock_log (the
// fence is UNIQUE) and bumps a counter with
//
//	UPDATE lock_counter SET n = n + 1, last_fence = ? WHERE id = 1 AND last_fence < ?
//
// which must match its row. Then: one log row and one counted write per
// acquisition, and the fences strictly increasing in the order of the
// log's inserts (the order of acquisition, if the lock excludes). On
// PostgreSQL and MariaDB.
func TestLockMultiProcess(t *testing.T) {
	if d := os.Getenv(envLockChildDialect); d != "" {
		lockChild(t, d)
		return
	}
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Parallel()
	forServers(t, func(t *testing.T, srv server) {
		ctx := t.Context()
		db, dsn := lockDB(t, srv)
		for _, q := range lockLogTable[srv.dialect.String()] {
			if _, err := db.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO lock_counter (id, n, last_fence) VALUES (1, 0, 0)"); err != nil {
			t.Fatal(err)
		}
		start := time.Now().Add(time.Second)
		type child struct {
			cmd            *exec.Cmd
			stdout, stderr bytes.Buffer
		}
		var children []*child
		for range lockProcesses {
			c := &child{cmd: exec.Command(os.Args[0], "-test.run=^TestLockMultiProcess$", "-test.count=1")}
			c.cmd.Env = append(os.Environ(), envLockChildDialect+"="+srv.dialect.String(), envLockChildDSN+"="+dsn,
				envLockChildStart+"="+strconv.FormatInt(start.UnixMilli(), 10))
			c.cmd.Stdout, c.cmd.Stderr = &c.stdout, &c.stderr
			if err := c.cmd.Start(); err != nil {
				t.Fatal(err)
			}
			children = append(children, c)
		}
		for i, c := range children {
			if err := c.cmd.Wait(); err != nil {
				t.Fatalf("child %d: %v\nstdout:\n%s\nstderr:\n%s", i, err, c.stdout.String(), c.stderr.String())
			}
		}
		checkLockLog(t, db)
	})
}

func checkLockLog(t *testing.T, db *sql.DB) {
	t.Helper()
	ctx := t.Context()
	const want = lockProcesses * lockGoroutines * lockRounds
	rows, err := db.QueryContext(ctx, "SELECT fence, owner FROM lock_log ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var last int64
	owners := map[string]bool{}
	n := 0
	for rows.Next() {
		var fence int64
		var owner string
		if err := rows.Scan(&fence, &owner); err != nil {
			t.Fatal(err)
		}
		if fence <= last {
			t.Errorf("log row %d: fence %d after %d: not strictly increasing in acquisition order", n, fence, last)
		}
		if owners[owner] {
			t.Errorf("owner %s logged twice", owner)
		}
		owners[owner], last = true, fence
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var count, lastFence int64
	if err := db.QueryRowContext(ctx, "SELECT n, last_fence FROM lock_counter WHERE id = 1").Scan(&count, &lastFence); err != nil {
		t.Fatal(err)
	}
	if n != want || count != want || lastFence != last {
		t.Fatalf("%d log rows, counter %d (last fence %d, log's last %d); want %d acquisitions", n, count, lastFence, last, want)
	}
	t.Logf("%d processes × %d goroutines × %d rounds: %d acquisitions, fences up to %d", lockProcesses, lockGoroutines, lockRounds, n, last)
}

func lockChild(t *testing.T, dialect string) {
	var srv *server
	for i := range servers {
		if servers[i].dialect.String() == dialect {
			srv = &servers[i]
		}
	}
	if srv == nil {
		t.Fatalf("unknown dialect %q", dialect)
	}
	db := srv.open(t, os.Getenv(envLockChildDSN))
	db.SetMaxOpenConns(lockGoroutines + 1)
	startMS, err := strconv.ParseInt(os.Getenv(envLockChildStart), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	b, err := sqlstore.NewLockBackend(db, &sqlstore.Config{Dialect: srv.dialect})
	if err != nil {
		t.Fatal(err)
	}
	l, err := lock.New(b, &lock.Config{TTL: 10 * time.Second, RetryMin: 2 * time.Millisecond, RetryMax: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	time.Sleep(time.Until(time.UnixMilli(startMS)))
	var mu sync.Mutex
	var errs []error
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for range lockGoroutines {
		wg.Go(func() {
			for range lockRounds {
				lease, err := l.Acquire(ctx, lockName)
				if err != nil {
					fail(err)
					return
				}
				work, stop := lease.Context(ctx)
				if _, err := db.ExecContext(work, srv.rebind("INSERT INTO lock_log (fence, owner) VALUES (?, ?)"), lease.Fence(), lease.Owner()); err != nil {
					fail(fmt.Errorf("log fence %d: %w", lease.Fence(), err))
				}
				res, err := db.ExecContext(work, srv.rebind("UPDATE lock_counter SET n = n + 1, last_fence = ? WHERE id = 1 AND last_fence < ?"), lease.Fence(), lease.Fence())
				if err == nil {
					if n, _ := res.RowsAffected(); n != 1 {
						err = fmt.Errorf("the counter refused fence %d", lease.Fence())
					}
				}
				if err != nil {
					fail(err)
				}
				stop()
				if err := lease.Release(ctx); err != nil {
					fail(fmt.Errorf("release fence %d: %w", lease.Fence(), err))
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d errors, first: %v", len(errs), errs[0])
	}
}
