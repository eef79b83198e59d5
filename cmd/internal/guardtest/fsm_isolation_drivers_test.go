package guardtest_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"

	"github.com/idemkit/idem/fsm"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testenv"
)

// TestTransitionRace90Drivers: 45 callers pay and 45 cancel one waiting
// order on a plain *sql.DB, through lib/pq as well as pgx at PostgreSQL's
// REPEATABLE READ and SERIALIZABLE defaults, and on MariaDB at each
// isolation level. Exactly one makes the transition; every caller with
// the winner's target is told AlreadyApplied, and every other gets an
// IllegalTransitionError whose Current is the winner's state, known.
func TestTransitionRace90Drivers(t *testing.T) {
	t.Parallel()
	pqAt := func(level string) func(t testing.TB) *sql.DB {
		return func(t testing.TB) *sql.DB {
			_, url := testdb.PostgresAt(t, level)
			return testdb.Open(t, "postgres", url, testenv.Postgres)
		}
	}
	pgxAt := func(level string) func(t testing.TB) *sql.DB {
		return func(t testing.TB) *sql.DB { db, _ := testdb.PostgresAt(t, level); return db }
	}
	myAt := func(level string) func(t testing.TB) *sql.DB {
		return func(t testing.TB) *sql.DB { db, _ := testdb.MySQLAt(t, level); return db }
	}
	for _, s := range []server{
		{"libpq-repeatable-read", postgres, pqAt("repeatable read")},
		{"libpq-serializable", postgres, pqAt("serializable")},
		{"pgx-repeatable-read", postgres, pgxAt("repeatable read")},
		{"pgx-serializable", postgres, pgxAt("serializable")},
		{"mariadb-REPEATABLE-READ", mysql, myAt("REPEATABLE-READ")},
		{"mariadb-READ-COMMITTED", mysql, myAt("READ-COMMITTED")},
		{"mariadb-SERIALIZABLE", mysql, myAt("SERIALIZABLE")},
	} {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db, tb := fsmSchema(t, s)
			db.SetMaxOpenConns(16)
			for id := int64(1); id <= 3; id++ {
				payCancelRace(t, db, tb, s.dialect, id, 90)
			}
		})
	}
}

// payCancelRace adds order id, waiting for payment, and races n callers on
// it through db, half paying and half cancelling. Exactly one makes the
// transition; every caller with the winner's target is told
// AlreadyApplied, and every other gets an IllegalTransitionError whose
// Current is the winner's state, known.
func payCancelRace(t *testing.T, db *sql.DB, tb *fsm.Table, d dialect, id int64, n int) {
	t.Helper()
	ctx := context.Background()
	addOrder(t, db, d, id, "WAIT_PAY", 1)
	errs := make([]error, n)
	results := make([]fsm.Result, n)
	targets := make([]fsm.State, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		targets[i] = "PAID"
		if i%2 == 1 {
			targets[i] = "CANCELLED"
		}
		wg.Go(func() {
			<-start
			results[i], errs[i] = tb.Transition(ctx, db, id, targets[i])
		})
	}
	close(start)
	wg.Wait()
	final := readOrder(t, db, d, id)
	made := 0
	for i := range n {
		var illegal *fsm.IllegalTransitionError
		switch {
		case errs[i] == nil && !results[i].AlreadyApplied:
			made++
		case errs[i] == nil:
			if targets[i] != final.Status {
				t.Errorf("order %d, caller %d: AlreadyApplied to %s, the order is %s", id, i, targets[i], final.Status)
			}
		case errors.As(errs[i], &illegal):
			if !illegal.CurrentKnown || illegal.Current != final.Status || illegal.Target != targets[i] || targets[i] == final.Status {
				t.Errorf("order %d, caller %d: %+v, the order is %s", id, i, illegal, final.Status)
			}
		default:
			t.Errorf("order %d, caller %d (%s): %v", id, i, targets[i], errs[i])
		}
	}
	if made != 1 || final.Version != 2 {
		t.Errorf("order %d: %d made the transition, it is %+v; want 1, version 2", id, made, final)
	}
}
