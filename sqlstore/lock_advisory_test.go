package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/lock"
)

// PGAdvisoryKey's doc gives the key in SQL; PostgreSQL computes the same.
func TestPGAdvisoryKeySQL(t *testing.T) {
	t.Parallel()
	db := servers[0].open(t, "")
	for _, name := range append([]string{"job", "ключ"}, lockTestNames()...) {
		var k int64
		err := db.QueryRowContext(t.Context(),
			`SELECT ('x' || left(encode(sha256(convert_to($1, 'UTF8')), 'hex'), 16))::bit(64)::bigint`, name).Scan(&k)
		if err != nil {
			t.Fatal(err)
		}
		if want := lock.PGAdvisoryKey(name); k != want {
			t.Errorf("%q: PostgreSQL says %d, PGAdvisoryKey %d", name, k, want)
		}
	}
}

func lockTestNames() []string {
	return []string{"", "a", strings.Repeat("é", 100), `'; --`}
}

func TestPGAdvisoryXactLock(t *testing.T) {
	t.Parallel()
	db := servers[0].open(t, "")
	ctx := t.Context()
	key := randomName("advisory-")
	begin := func() *sql.Tx {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback() })
		return tx
	}
	t1, t2 := begin(), begin()
	if err := lock.PGAdvisoryXactLock(ctx, t1, key); err != nil {
		t.Fatal(err)
	}
	if err := lock.PGTryAdvisoryXactLock(ctx, t2, key); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("try while held = %v, want ErrHeld", err)
	}
	if err := lock.PGTryAdvisoryXactLock(ctx, t2, key+"-other"); err != nil {
		t.Fatalf("try of another name = %v", err)
	}
	// The name's key is PGAdvisoryKey's: SQL of another language takes
	// the same lock.
	var ok bool
	if err := t2.QueryRowContext(ctx, "SELECT pg_try_advisory_xact_lock($1)", lock.PGAdvisoryKey(key)).Scan(&ok); err != nil || ok {
		t.Fatalf("pg_try_advisory_xact_lock(PGAdvisoryKey(name)) while held = %v, %v; want false", ok, err)
	}
	if err := lock.PGTryAdvisoryXactLock(ctx, t2, ""); !errors.Is(err, lock.ErrInvalidName) {
		t.Errorf("empty name = %v, want ErrInvalidName", err)
	}
	// A waiter ends with its context.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	t3 := begin()
	if err := lock.PGAdvisoryXactLock(short, t3, key); !errors.Is(err, lock.ErrHeld) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("PGAdvisoryXactLock while held until ctx ends = %v, want ErrHeld and DeadlineExceeded", err)
	}
	// A waiter gets it when the holder's transaction ends.
	got := make(chan error, 1)
	t4 := begin()
	go func() { got <- lock.PGAdvisoryXactLock(ctx, t4, key) }()
	select {
	case err := <-got:
		t.Fatalf("PGAdvisoryXactLock returned %v while held", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := t1.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter after the commit: %v", err)
	}
	if err := lock.PGTryAdvisoryXactLock(ctx, t2, key); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("try while the waiter holds it = %v, want ErrHeld", err)
	}
}

func TestMySQLGetLock(t *testing.T) {
	t.Parallel()
	db := servers[1].open(t, "")
	ctx := t.Context()
	conn := func() *sql.Conn {
		t.Helper()
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	name := randomName("idemtest:")
	c1, c2 := conn(), conn()
	release, err := lock.MySQLTryGetLock(ctx, c1, name)
	if err != nil {
		t.Fatal(err)
	}
	var holder sql.NullInt64
	if err := c2.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", name).Scan(&holder); err != nil || !holder.Valid {
		t.Fatalf("IS_USED_LOCK: %v, %v", holder, err)
	}
	if _, err := lock.MySQLTryGetLock(ctx, c2, name); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("GET_LOCK while held = %v, want ErrHeld", err)
	}
	// A wait bounded by ctx's deadline ends with it: the server waits
	// that long (rounded up to a second).
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	c3 := conn()
	if _, err := lock.MySQLGetLock(short, c3, name); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("GET_LOCK while held until ctx's deadline = %v, want ErrHeld", err)
	}
	// A waiter gets it once the holder releases.
	got := make(chan error, 1)
	var release2 func(context.Context) error
	go func() {
		var err error
		wait, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		release2, err = lock.MySQLGetLock(wait, c2, name)
		got <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if err := release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	if err := release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("release by the former holder = %v, want ErrNotHeld", err)
	}
	if err := release2(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c2.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", name).Scan(&holder); err != nil || holder.Valid {
		t.Fatalf("IS_USED_LOCK after release: %v, %v", holder, err)
	}
	for _, bad := range []string{"", strings.Repeat("x", lock.MaxMySQLLockName+1)} {
		if _, err := lock.MySQLTryGetLock(ctx, c1, bad); !errors.Is(err, lock.ErrInvalidName) {
			t.Errorf("GET_LOCK(%d bytes) = %v, want ErrInvalidName", len(bad), err)
		}
	}
	if _, err := lock.MySQLTryGetLock(ctx, c1, strings.Repeat("é", lock.MaxMySQLLockName)); err != nil {
		t.Errorf("GET_LOCK of 64 characters: %v", err)
	}
}

// A ctx without a deadline waits for the lock however long the holder
// keeps it (MariaDB refuses GET_LOCK's negative timeouts, which MySQL
// reads as no limit, with a NULL answer): on a free lock, and behind a
// holder.
func TestMySQLGetLockNoTimeout(t *testing.T) {
	t.Parallel()
	db := servers[1].open(t, "")
	ctx := t.Context()
	c1, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c1.Close() })
	c2, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c2.Close() })
	name := randomName("idemtest:")
	release, err := lock.MySQLGetLock(ctx, c1, name)
	if err != nil {
		t.Fatalf("GET_LOCK without a timeout on a free lock: %v", err)
	}
	got := make(chan error, 1)
	var release2 func(context.Context) error
	go func() {
		var err error
		release2, err = lock.MySQLGetLock(ctx, c2, name)
		got <- err
	}()
	// The waiter is queued on the server before the holder lets go.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT GET_LOCK(%'").Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		select {
		case err := <-got:
			t.Fatalf("waiter answered before the release: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter never showed in the process list")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter without a timeout: %v", err)
	}
	var holder sql.NullInt64
	if err := c1.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?) = CONNECTION_ID()", name).Scan(&holder); err != nil || !holder.Valid || holder.Int64 != 0 {
		t.Fatalf("IS_USED_LOCK from the former holder: %v, %v; want another session", holder, err)
	}
	if err := release2(ctx); err != nil {
		t.Fatal(err)
	}
}
