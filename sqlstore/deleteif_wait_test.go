package sqlstore_test

import (
	"database/sql"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlstore"
)

// TestDeleteIfWaitsForAChange: a DeleteIf whose statement waits for a
// concurrent change of the record (written by hand in a transaction the
// test holds open) answers by what the record is once that change
// commits, under each isolation level the sessions may default to: a
// takeover (another owner and fence) is kept with idem.ErrRecordChanged;
// the holder's own write (its owner and fence kept, as a renewal does)
// leaves the record the one read, deleted; a deletion leaves none,
// idem.ErrNotFound. PostgreSQL's statement reads the record as its
// snapshot showed it, and under REPEATABLE READ or SERIALIZABLE fails
// with a serialization failure: both are run again.
func TestDeleteIfWaitsForAChange(t *testing.T) {
	levels := map[sqlstore.Dialect][]string{
		sqlstore.PostgreSQL: {"read committed", "repeatable read", "serializable"},
		sqlstore.MySQL:      {"REPEATABLE-READ", "READ-COMMITTED", "SERIALIZABLE"},
	}
	forServers(t, func(t *testing.T, srv server) {
		admin, _ := srv.setup(t) // migrated
		for _, level := range levels[srv.dialect] {
			addr := srv.addrWith(t,
				func(q url.Values) { q.Set("default_transaction_isolation", level) },
				func(c *mysql.Config) {
					if c.Params == nil {
						c.Params = map[string]string{}
					}
					c.Params["tx_isolation"] = "'" + level + "'"
				})
			s, err := sqlstore.New(srv.open(t, addr), &sqlstore.Config{Dialect: srv.dialect})
			if err != nil {
				t.Fatal(err)
			}
			for _, change := range []struct {
				name, stmt string
				want       error // nil: deleted
			}{
				{"takeover", `UPDATE idem_records SET owner = 'intruder', fence = fence + 1 WHERE scope = ? AND idempotency_key = ?`, idem.ErrRecordChanged},
				{"holder's write", `UPDATE idem_records SET fingerprint = 'fp2' WHERE scope = ? AND idempotency_key = ?`, nil},
				{"deletion", `DELETE FROM idem_records WHERE scope = ? AND idempotency_key = ?`, idem.ErrNotFound},
			} {
				t.Run(level+"/"+change.name, func(t *testing.T) {
					t.Parallel()
					ctx := t.Context()
					r := idem.AcquireRequest{Scope: randomName("delif-"), Key: "k", Fingerprint: "fp", Lease: long, Retention: long}
					l := mustAcquire(t, s, r, idem.Acquired).Lease
					tx, err := admin.BeginTx(ctx, nil)
					if err != nil {
						t.Fatal(err)
					}
					defer tx.Rollback()
					if _, err := tx.ExecContext(ctx, srv.rebind(change.stmt), r.Scope, r.Key); err != nil {
						t.Fatal(err)
					}
					done := make(chan error, 1)
					go func() { done <- s.DeleteIf(ctx, r.Scope, r.Key, l.Owner, l.Fence) }()
					waitRowLock(t, admin, tx, srv.dialect, done)
					if err := tx.Commit(); err != nil {
						t.Fatal(err)
					}
					var got error
					select {
					case got = <-done:
					case <-time.After(30 * time.Second):
						t.Fatal("DeleteIf did not return within 30 s of the commit")
					}
					if (change.want == nil) != (got == nil) || (change.want != nil && !errors.Is(got, change.want)) {
						t.Fatalf("DeleteIf racing a %s under %s = %v, want %v", change.name, level, got, change.want)
					}
					rec, err := s.Get(ctx, r.Scope, r.Key)
					switch {
					case change.name == "takeover" && (err != nil || rec.Owner != "intruder"):
						t.Fatalf("after the refused DeleteIf: %+v, %v; want the intruder's record", rec, err)
					case change.name != "takeover" && !errors.Is(err, idem.ErrNotFound):
						t.Fatalf("after DeleteIf: %+v, %v; want no record", rec, err)
					}
				})
			}
		}
	})
}

// waitRowLock returns once a statement waits for a lock tx holds. It
// fails the test when the statement finished first (its error arrives on
// done) or when no wait shows within 30 seconds.
func waitRowLock(t *testing.T, admin *sql.DB, tx *sql.Tx, d sqlstore.Dialect, done <-chan error) {
	t.Helper()
	ctx := t.Context()
	q, me, poll := `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, `SELECT pg_backend_pid()`, 5*time.Millisecond
	if d == sqlstore.MySQL {
		q = `SELECT COUNT(*) FROM information_schema.innodb_lock_waits w
			JOIN information_schema.innodb_trx b ON b.trx_id = w.blocking_trx_id
			WHERE b.trx_mysql_thread_id = ?`
		me = `SELECT CONNECTION_ID()`
		// InnoDB refreshes the snapshot behind these tables only when it
		// was not read for 100 ms: a faster poll reads a stale table.
		poll = 150 * time.Millisecond
	}
	var id int64
	if err := tx.QueryRowContext(ctx, me).Scan(&id); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := admin.QueryRowContext(ctx, q, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("DeleteIf returned before the change committed: %v", err)
		case <-time.After(poll):
		}
		if time.Now().After(deadline) {
			t.Fatal("DeleteIf does not wait for the row after 30 s")
		}
	}
}
