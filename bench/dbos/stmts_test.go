package dbosbench

import (
	"context"
	"strings"
	"testing"
)

// TestStatementsPerStep runs a workflow of two steps of each kind and
// logs the statements it sent (go test -run StatementsPerStep -v): what a
// step costs in round trips, and what it writes. Statements of other
// connections (DBOS's background polling) may appear among them. It
// checks the effect: each step inserted its row once.
func TestStatementsPerStep(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	for _, k := range e.kinds() {
		t.Run(k.name, func(t *testing.T) {
			// Once unrecorded: DBOS's first statements after Launch (its
			// queue runner, LISTEN) and pgx's first prepares would be in
			// the log.
			k.run(t, 2)
			stmts := e.stmts.record(func() { k.run(t, 2) })
			t.Logf("%s, a workflow of 2 steps: %d statements", k.name, len(stmts))
			for _, s := range stmts {
				t.Log("  " + strings.Join(strings.Fields(s), " "))
			}
			var rows int
			if err := e.sqlDB.QueryRowContext(ctx, `SELECT count(*) FROM bench_effects WHERE op = $1`, k.name).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if rows != 4 {
				t.Errorf("%d rows of op %s after two workflows of 2 steps, want 4", rows, k.name)
			}
		})
	}
}
