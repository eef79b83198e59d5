package shop_test

import (
	"database/sql"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/sqlstore"
)

// isolationBackends are the servers under the other isolation defaults
// sqlstore supports (postgresBackend runs READ COMMITTED and mysqlBackend
// REPEATABLE READ, both set on the session): a PostgreSQL session whose
// default_transaction_isolation is REPEATABLE READ or SERIALIZABLE (where
// a write conflict is a serialisation failure, 40001, and SERIALIZABLE
// also fails transactions on predicate locks), and a MariaDB session at
// READ COMMITTED or SERIALIZABLE (plain reads in a transaction take
// shared locks: deadlocks).
var isolationBackends = []backend{
	{"postgres-repeatable-read", sqlstore.PostgreSQL, freshPostgresAt("repeatable read")},
	{"postgres-serializable", sqlstore.PostgreSQL, freshPostgresAt("serializable")},
	{"mysql-read-committed", sqlstore.MySQL, freshMySQLAt("READ COMMITTED")},
	{"mysql-serializable", sqlstore.MySQL, freshMySQLAt("SERIALIZABLE")},
}

// forIsolations runs f as a parallel subtest on each backend and on each
// of isolationBackends: SQLite, and PostgreSQL and MariaDB at each of
// their isolation levels.
func forIsolations(t *testing.T, f func(t *testing.T, b backend)) {
	for _, b := range append(append([]backend{}, backends...), isolationBackends...) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			f(t, b)
		})
	}
}

// freshPostgresAt: a schema of the test's own, reached by sessions whose
// default_transaction_isolation is level (a runtime parameter of the URL;
// testdb fails the test when the session does not run at it).
func freshPostgresAt(level string) func(t *testing.T) (*sql.DB, string) {
	return func(t *testing.T) (*sql.DB, string) { return testdb.PostgresAt(t, level) }
}

// freshMySQLAt: a database of the test's own, reached by sessions whose
// transaction isolation is level (MariaDB has no per-database default;
// the driver sets the session variable on each connection, and testdb
// fails the test when the session does not run at level).
func freshMySQLAt(level string) func(t *testing.T) (*sql.DB, string) {
	return func(t *testing.T) (*sql.DB, string) {
		db, dsn := testdb.MySQLAt(t, level)
		return db, "mysql:" + dsn
	}
}

// One submit token sent three times at once with three keys: one 201,
// two 409 DUPLICATE_SUBMISSION naming its order, and one order.
func TestSubmitTokenSentThriceAtOnce(t *testing.T) {
	forIsolations(t, func(t *testing.T, b backend) {
		s, db := webShop(t, b)
		rec := serve(s, "POST", "/tokens", map[string]string{"X-User-ID": "21"}, "")
		var tr struct{ Token string }
		if rec.Code != http.StatusCreated || json.Unmarshal(rec.Body.Bytes(), &tr) != nil {
			t.Fatalf("POST /tokens: %d %s", rec.Code, rec.Body)
		}
		const n = 3
		recs := make([]*httptest.ResponseRecorder, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				recs[i] = serve(s, "POST", "/orders", map[string]string{"X-User-ID": "21", "Idempotency-Key": "thrice-" + string(rune('a'+i)), "Submit-Token": tr.Token}, `{"sku":"SKU-1","quantity":1}`)
			})
		}
		close(start)
		wg.Wait()
		created, dups, orderNo := 0, 0, ""
		for i, rec := range recs {
			switch {
			case rec.Code == http.StatusCreated:
				created++
				if loc := rec.Header().Get("Location"); orderNo == "" {
					orderNo = strings.TrimPrefix(loc, "/orders/")
				}
			case rec.Code == http.StatusConflict && problemCode(t, rec) == "DUPLICATE_SUBMISSION":
				dups++
			default:
				t.Errorf("submission %d: %d %s", i, rec.Code, rec.Body)
			}
		}
		if created != 1 || dups != 2 {
			t.Fatalf("%d × 201 and %d × DUPLICATE_SUBMISSION, want 1 and 2", created, dups)
		}
		for i, rec := range recs {
			if rec.Code == http.StatusConflict && rec.Header().Get("Location") != "/orders/"+orderNo {
				t.Errorf("submission %d names %q, want the order %s", i, rec.Header().Get("Location"), orderNo)
			}
		}
		if got := count(t, db, "SELECT COUNT(*) FROM shop_orders"); got != 1 {
			t.Fatalf("%d orders, want 1", got)
		}
	})
}

// 60 users claim coupon 1 (100 left) at once: every claim waits on the
// coupon's row lock, and under REPEATABLE READ or SERIALIZABLE all but one
// of the waiters fail each round with a serialisation failure; the retry
// policy runs them again until each is in: 60 × 201, 60 claim rows,
// claimed = 60.
func TestConcurrentClaimsBurst(t *testing.T) {
	forIsolations(t, func(t *testing.T, b backend) {
		s, db := newShop(t, b)
		const n = 60
		statuses := make([]int, n)
		codes := make([]string, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				statuses[i], _, codes[i] = claimCoupon(t, s, int64(i+1), "1")
			})
		}
		close(start)
		wg.Wait()
		for i := range n {
			if statuses[i] != http.StatusCreated {
				t.Errorf("user %d: %d %s", i+1, statuses[i], codes[i])
			}
		}
		if got := countRows(t, db, `SELECT COUNT(*) FROM shop_coupon_claims WHERE coupon_id = 1`); got != n {
			t.Errorf("%d claim rows, want %d", got, n)
		}
		if got := countRows(t, db, `SELECT claimed FROM shop_coupons WHERE id = 1`); got != n {
			t.Errorf("claimed = %d, want %d", got, n)
		}
	})
}
