package guardtest_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/fsm"
	"github.com/idemkit/idem/internal/testdb"
)

// TestTransitionRaceOnDBUnderIsolationDefault: 20 callers pay and 20
// cancel one waiting order on a plain *sql.DB (each statement its own
// transaction) whose sessions default to REPEATABLE READ or SERIALIZABLE.
// A loser's UPDATE waited for the winner's and then failed with SQLSTATE
// 40001; fsm runs such a statement again (it was alone in its
// transaction), so the loser gets what it gets under READ COMMITTED:
// AlreadyApplied, or an IllegalTransitionError naming the winner's state.
func TestTransitionRaceOnDBUnderIsolationDefault(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(strings.ReplaceAll(level, " ", "-"), func(t *testing.T) {
			t.Parallel()
			s := server{"PostgreSQL-" + level, postgres, func(t testing.TB) *sql.DB {
				db, _ := testdb.PostgresAt(t, level)
				return db
			}}
			db, tb := fsmSchema(t, s)
			ctx := context.Background()
			// Five orders, one after the other: a round's losers meet the
			// winner's commit only when their UPDATE waited for it.
			for id := int64(1); id <= 5; id++ {
				addOrder(t, db, postgres, id, "WAIT_PAY", 1)
				const n = 40
				errs := make([]error, n)
				results := make([]fsm.Result, n)
				start := make(chan struct{})
				var wg sync.WaitGroup
				for i := range n {
					wg.Go(func() {
						<-start
						to := fsm.State("PAID")
						if i%2 == 1 {
							to = "CANCELLED"
						}
						results[i], errs[i] = tb.Transition(ctx, db, id, to)
					})
				}
				close(start)
				wg.Wait()
				final := readOrder(t, db, postgres, id)
				made := 0
				for i := range n {
					var illegal *fsm.IllegalTransitionError
					switch {
					case errs[i] == nil && !results[i].AlreadyApplied:
						made++
					case errs[i] == nil:
						if results[i].To != fsm.State(final.Status) {
							t.Errorf("order %d, caller %d: AlreadyApplied to %s, the order is %s", id, i, results[i].To, final.Status)
						}
					case errors.As(errs[i], &illegal):
						if illegal.Current != fsm.State(final.Status) {
							t.Errorf("order %d, caller %d: %v, the order is %s", id, i, errs[i], final.Status)
						}
					default:
						t.Errorf("order %d, caller %d: %v", id, i, errs[i])
					}
				}
				if made != 1 || final.Version != 2 {
					t.Errorf("order %d: %d made the transition, it is %+v; want 1, version 2", id, made, final)
				}
			}
		})
	}
}
