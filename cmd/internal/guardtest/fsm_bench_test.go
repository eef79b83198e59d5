package guardtest_test

import (
	"context"
	"testing"

	"github.com/idemkit/idem/fsm"
	"github.com/idemkit/idem/internal/benchpair"
)

// BenchmarkTransition measures Table.Transition (one conditional UPDATE …
// RETURNING) and a transition already applied (the UPDATE that changes
// nothing, then the read) against the bare conditional UPDATE, in one
// interleaved loop (benchpair). Rows go back and forth between two states.
//
//	go test -run '^$' -bench Transition -benchmem ./internal/guardtest/
func BenchmarkTransition(b *testing.B) {
	pingPong := fsm.MustNew(&fsm.Definition{
		States:  []fsm.State{"A", "B"},
		Initial: "A",
		Transitions: []fsm.Transition{
			{Name: "ab", From: []fsm.State{"A"}, To: "B"},
			{Name: "ba", From: []fsm.State{"B"}, To: "A"},
		},
	})
	for _, s := range []server{servers[0], servers[3]} { // PostgreSQL (pgx), SQLite
		b.Run(s.name, func(b *testing.B) {
			db, _ := fsmSchema(b, s)
			tb, err := fsm.NewTable(pingPong, &fsm.TableConfig{Dialect: s.dialect, Table: "orders"})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			d := s.dialect
			addOrder(b, db, d, 1, "A", 0) // bare UPDATE
			addOrder(b, db, d, 2, "A", 0) // Transition
			addOrder(b, db, d, 3, "B", 0) // already applied
			bare := rebind(d, `UPDATE orders SET status = ?, version = version + 1 WHERE id = ? AND status = ?`)
			next := map[fsm.State]fsm.State{"A": "B", "B": "A"}
			bareState, state := fsm.State("A"), fsm.State("A")
			means := benchpair.Run(b,
				benchpair.Func{Name: "bare-update", F: func() {
					to := next[bareState]
					r, err := db.ExecContext(ctx, bare, string(to), 1, string(bareState))
					if err != nil {
						b.Fatal(err)
					}
					if n, _ := r.RowsAffected(); n != 1 {
						b.Fatalf("bare UPDATE: %d rows", n)
					}
					bareState = to
				}},
				benchpair.Func{Name: "transition", F: func() {
					to := next[state]
					if res, err := tb.Transition(ctx, db, int64(2), to); err != nil || res.AlreadyApplied {
						b.Fatal(res, err)
					}
					state = to
				}},
				benchpair.Func{Name: "already-applied", F: func() {
					if res, err := tb.Transition(ctx, db, int64(3), "B"); err != nil || !res.AlreadyApplied {
						b.Fatal(res, err)
					}
				}},
			)
			benchpair.Ratio(b, "transition-x-update", means[1], means[0])
			benchpair.Ratio(b, "already-x-update", means[2], means[0])
		})
	}
}
