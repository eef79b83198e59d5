package guardtest_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/uniq"
)

// TestInsertOrGetDeadlockKeepsCause: two MariaDB transactions insert two
// keys in opposite orders, each through InsertOrGet, and deadlock. InnoDB
// rolls the victim's whole transaction back, savepoint included, so the
// ROLLBACK TO SAVEPOINT that follows fails too: the error InsertOrGet
// returns must still carry the deadlock (1213), which is what a caller
// retries the transaction on, and must not be taken for a duplicate.
func TestInsertOrGetDeadlockKeepsCause(t *testing.T) {
	t.Parallel()
	s := servers[2]
	if s.dialect != mysql {
		t.Fatalf("servers[2] is %s", s.name)
	}
	db := uniqSchema(t, s)
	ctx := context.Background()
	tx1, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback()
	tx2, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback()
	ins := func(tx *sql.Tx, ref string) error {
		_, _, err := uniq.InsertOrGet(ctx, tx, insertOrder(s.dialect, ref, "", 1), getOrder(s.dialect, ref))
		return err
	}
	if err := ins(tx1, "k1"); err != nil {
		t.Fatal(err)
	}
	if err := ins(tx2, "k2"); err != nil {
		t.Fatal(err)
	}
	var (
		errs [2]error
		wg   sync.WaitGroup
	)
	wg.Go(func() { errs[0] = ins(tx1, "k2") }) // waits for tx2
	wg.Go(func() { errs[1] = ins(tx2, "k1") }) // waits for tx1: a deadlock
	wg.Wait()
	victims := 0
	for i, err := range errs {
		if err == nil {
			continue
		}
		victims++
		var my *mysqldriver.MySQLError
		if !errors.As(err, &my) || my.Number != 1213 {
			t.Errorf("transaction %d: %v; want an error that wraps the deadlock (MySQL error 1213)", i+1, err)
		}
		if errors.Is(err, uniq.ErrUnresolved) {
			t.Errorf("transaction %d: %v is an UnresolvedError", i+1, err)
		}
	}
	if victims != 1 {
		t.Fatalf("%d transactions failed (%v), want the deadlock's victim", victims, errs)
	}
}

// TestInsertOrGetCancelledInTx: the context is cancelled while the insert
// runs in a PostgreSQL transaction (it waits for a row lock another
// transaction holds). The error InsertOrGet returns must say so
// (errors.Is context.Canceled), whatever the ROLLBACK TO SAVEPOINT that
// follows answers on a connection the driver gave up.
func TestInsertOrGetCancelledInTx(t *testing.T) {
	t.Parallel()
	for _, s := range servers[:3] {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db := uniqSchema(t, s)
			bg := context.Background()
			holder, err := db.BeginTx(bg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Rollback()
			if _, err := holder.ExecContext(bg, rebind(s.dialect, `INSERT INTO orders (ref, amount) VALUES ('held', 1)`)); err != nil {
				t.Fatal(err)
			}
			tx, err := db.BeginTx(bg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			started := make(chan struct{})
			insert := func(ctx context.Context, q uniq.Querier) (order, error) {
				close(started)
				return insertOrder(s.dialect, "held", "", 2)(ctx, q) // waits for holder
			}
			done := make(chan error, 1)
			go func() {
				_, _, err := uniq.InsertOrGet(ctx, tx, insert, getOrder(s.dialect, "held"))
				done <- err
			}()
			<-started
			// Wait until the insert is blocked on the holder's lock.
			waitBlocked(t, db, s.dialect, done)
			cancel()
			err = <-done
			if !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled during the insert: %v; want an error that is context.Canceled", err)
			}
		})
	}
}

// waitBlocked returns once a statement waits for a lock on the server. It
// fails the test when the statement finished without waiting (its error
// arrives on done) or when no wait shows within 30 seconds.
func waitBlocked(t *testing.T, db *sql.DB, d dialect, done <-chan error) {
	t.Helper()
	q := `SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`
	poll := time.Millisecond
	if d == mysql {
		q = `SELECT COUNT(*) FROM information_schema.innodb_trx t
			JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id
			WHERE t.trx_state = 'LOCK WAIT' AND p.db = DATABASE()`
		// InnoDB refreshes the snapshot behind innodb_trx only when it was
		// not read for 100 ms: a faster poll reads a stale table forever.
		poll = 150 * time.Millisecond
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-done:
			t.Fatalf("the statement finished without waiting for the lock: %v", err)
		default:
		}
		var n int
		if err := db.QueryRowContext(context.Background(), q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no statement waits for a lock after 30 s")
		}
		time.Sleep(poll)
	}
}

// wrappedTx is a transaction as sqlx and tracing wrappers hand it out: a
// type of their own that embeds *sql.Tx.
type wrappedTx struct{ *sql.Tx }

// TestInsertOrGetWrappedTx: a transaction wrapped in another type (sqlx's
// *Tx embeds *sql.Tx) is still a transaction: the duplicate is met in a
// savepoint, and on PostgreSQL the transaction goes on and commits.
func TestInsertOrGetWrappedTx(t *testing.T) {
	t.Parallel()
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db := uniqSchema(t, s)
			ctx := context.Background()
			d := s.dialect
			if _, _, err := uniq.InsertOrGet(ctx, db, insertOrder(d, "w-1", "", 5), getOrder(d, "w-1")); err != nil {
				t.Fatal(err)
			}
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			q := wrappedTx{tx}
			o, created, err := uniq.InsertOrGet(ctx, q, insertOrder(d, "w-1", "", 6), getOrder(d, "w-1"))
			if err != nil || created || o.Amount != 5 {
				t.Fatalf("duplicate in a wrapped tx: %+v, created %v, %v", o, created, err)
			}
			if _, _, err := uniq.InsertOrGet(ctx, q, insertOrder(d, "w-2", "", 7), getOrder(d, "w-2")); err != nil {
				t.Fatalf("insert after the duplicate: %v", err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if n := count(t, db, d, `SELECT COUNT(*) FROM orders WHERE ref IN ('w-1', 'w-2')`); n != 2 {
				t.Errorf("%d rows, want w-1 and w-2", n)
			}
		})
	}
}
