package guardtest_test

import (
	"database/sql"
	"strings"
	"testing"

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
			// Five orders, one after the other: a round's losers meet the
			// winner's commit only when their UPDATE waited for it.
			for id := int64(1); id <= 5; id++ {
				payCancelRace(t, db, tb, postgres, id, 40)
			}
		})
	}
}
