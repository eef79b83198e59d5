package guardtest_test

import (
	"context"
	"database/sql"
	"errors"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/fsm"
)

// orderMachine is the order life cycle of the fsm tests.
var orderMachine = fsm.MustNew(&fsm.Definition{
	States:  []fsm.State{"NEW", "WAIT_PAY", "PAID", "SHIPPED", "CANCELLED"},
	Initial: "NEW",
	Final:   []fsm.State{"SHIPPED", "CANCELLED"},
	Transitions: []fsm.Transition{
		{Name: "submit", From: []fsm.State{"NEW"}, To: "WAIT_PAY"},
		{Name: "pay", From: []fsm.State{"WAIT_PAY"}, To: "PAID"},
		{Name: "ship", From: []fsm.State{"PAID"}, To: "SHIPPED"},
		{Name: "cancel", From: []fsm.State{"NEW", "WAIT_PAY"}, To: "CANCELLED"},
	},
})

// fsmSchema creates the orders table (and effects, a row per side effect)
// on a fresh database of s, and returns the pool and the bound Table.
func fsmSchema(t testing.TB, s server) (*sql.DB, *fsm.Table) {
	t.Helper()
	db := s.open(t)
	ts := map[dialect]string{postgres: "TIMESTAMPTZ", mysql: "DATETIME(6)", sqlite3: "TEXT"}[s.dialect]
	execAll(t, db,
		`CREATE TABLE orders (
			id BIGINT PRIMARY KEY,
			status VARCHAR(32) NOT NULL,
			version BIGINT NOT NULL DEFAULT 0,
			note VARCHAR(64),
			paid_at `+ts+`
		)`,
		`CREATE TABLE effects (order_id BIGINT NOT NULL, caller INT NOT NULL)`,
	)
	tb, err := fsm.NewTable(orderMachine, &fsm.TableConfig{Dialect: s.dialect, Table: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	return db, tb
}

// addOrder inserts an order in status at version.
func addOrder(t testing.TB, db *sql.DB, d dialect, id int64, status fsm.State, version int64) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), rebind(d, `INSERT INTO orders (id, status, version) VALUES (?, ?, ?)`), id, string(status), version); err != nil {
		t.Fatal(err)
	}
}

// row is an order as stored.
type row struct {
	Status  fsm.State
	Version int64
	Note    sql.NullString
	Paid    bool // paid_at is set
}

func readOrder(t testing.TB, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, d dialect, id int64) row {
	t.Helper()
	var r row
	var status string
	if err := q.QueryRowContext(context.Background(), rebind(d, `SELECT status, version, note, paid_at IS NOT NULL FROM orders WHERE id = ?`), id).
		Scan(&status, &r.Version, &r.Note, &r.Paid); err != nil {
		t.Fatalf("order %d: %v", id, err)
	}
	r.Status = fsm.State(status)
	return r
}

// TestTransitionServers walks each outcome of Transition and Fire on each
// server, and checks the row after each.
func TestTransitionServers(t *testing.T) {
	t.Parallel()
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db, tb := fsmSchema(t, s)
			ctx := context.Background()
			d := s.dialect
			addOrder(t, db, d, 1, "NEW", 0)
			addOrder(t, db, d, 2, "WAIT_PAY", 5)
			want := func(id int64, w row) {
				t.Helper()
				if got := readOrder(t, db, d, id); got != w {
					t.Errorf("order %d is %+v, want %+v", id, got, w)
				}
			}

			res, err := tb.Fire(ctx, db, int64(1), "submit")
			if err != nil || res != (fsm.Result{Previous: "NEW", To: "WAIT_PAY", Version: 1}) {
				t.Fatalf("submit: %+v, %v", res, err)
			}
			want(1, row{Status: "WAIT_PAY", Version: 1})

			// Pay, with the expected version, a value and the database's clock.
			res, err = tb.Transition(ctx, db, int64(1), "PAID", fsm.IfVersion(1), fsm.Set("note", "card"), fsm.SetNow("paid_at"))
			if err != nil || res != (fsm.Result{Previous: "WAIT_PAY", To: "PAID", Version: 2}) {
				t.Fatalf("pay: %+v, %v", res, err)
			}
			want(1, row{Status: "PAID", Version: 2, Note: sql.NullString{String: "card", Valid: true}, Paid: true})

			// The retry of the same call: already applied, nothing changes.
			res, err = tb.Transition(ctx, db, int64(1), "PAID", fsm.IfVersion(1), fsm.Set("note", "again"))
			if err != nil || res != (fsm.Result{To: "PAID", Version: 2, AlreadyApplied: true}) {
				t.Fatalf("pay again: %+v, %v", res, err)
			}
			want(1, row{Status: "PAID", Version: 2, Note: sql.NullString{String: "card", Valid: true}, Paid: true})

			// Cancel a paid order: illegal, naming the state it is in.
			var ie *fsm.IllegalTransitionError
			res, err = tb.Fire(ctx, db, int64(1), "cancel", fsm.Set("note", "cancel"))
			if !errors.As(err, &ie) || !errors.Is(err, fsm.ErrIllegal) || !reflect.DeepEqual(*ie, fsm.IllegalTransitionError{ID: int64(1), Current: "PAID", CurrentKnown: true, Target: "CANCELLED", Allowed: []fsm.State{"NEW", "WAIT_PAY"}, Version: 2}) || res != (fsm.Result{}) {
				t.Fatalf("cancel a paid order: %+v, %v", res, err)
			}
			want(1, row{Status: "PAID", Version: 2, Note: sql.NullString{String: "card", Valid: true}, Paid: true})

			// A stale version: a conflict, and the extra columns stay as they were.
			var ce *fsm.ConflictError
			_, err = tb.Transition(ctx, db, int64(2), "PAID", fsm.IfVersion(4), fsm.Set("note", "stale"), fsm.SetNow("paid_at"))
			if !errors.As(err, &ce) || !errors.Is(err, fsm.ErrConflict) ||
				*ce != (fsm.ConflictError{ID: int64(2), Current: "WAIT_PAY", Version: 5, Target: "PAID", Expected: 4, HasExpected: true}) {
				t.Fatalf("stale version: %v", err)
			}
			want(2, row{Status: "WAIT_PAY", Version: 5})

			// Two possible sources: From is not known.
			res, err = tb.Transition(ctx, db, int64(2), "CANCELLED", fsm.IfVersion(5))
			if err != nil || res != (fsm.Result{To: "CANCELLED", Version: 6}) {
				t.Fatalf("cancel: %+v, %v", res, err)
			}
			want(2, row{Status: "CANCELLED", Version: 6})

			if _, err := tb.Transition(ctx, db, int64(99), "PAID"); !errors.Is(err, fsm.ErrNotFound) {
				t.Fatalf("missing row: %v, want ErrNotFound", err)
			}
		})
	}
}

// TestTransitionTxServers: a transition in a *sql.Tx commits or rolls back
// with the transaction's other writes; on a *sql.Conn it works too.
func TestTransitionTxServers(t *testing.T) {
	t.Parallel()
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db, tb := fsmSchema(t, s)
			ctx := context.Background()
			d := s.dialect
			addOrder(t, db, d, 1, "NEW", 0)

			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res, err := tb.Fire(ctx, tx, int64(1), "submit", fsm.Set("note", "rolled back")); err != nil || res.Version != 1 {
				t.Fatalf("submit in tx: %+v, %v", res, err)
			}
			if got := readOrder(t, tx, d, 1); got.Status != "WAIT_PAY" {
				t.Errorf("inside the tx the order is %+v", got)
			}
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			if got := readOrder(t, db, d, 1); got != (row{Status: "NEW"}) {
				t.Errorf("after rollback the order is %+v, want NEW at version 0", got)
			}

			err = inTransaction(ctx, db, func(tx *sql.Tx) error {
				if _, err := tb.Fire(ctx, tx, int64(1), "submit"); err != nil {
					return err
				}
				// The refused transition leaves the transaction usable.
				if _, err := tb.Fire(ctx, tx, int64(1), "ship"); !errors.Is(err, fsm.ErrIllegal) {
					t.Errorf("ship a waiting order: %v", err)
				}
				_, err := tx.ExecContext(ctx, rebind(d, `INSERT INTO effects (order_id, caller) VALUES (?, 0)`), 1)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := readOrder(t, db, d, 1); got != (row{Status: "WAIT_PAY", Version: 1}) {
				t.Errorf("after commit the order is %+v", got)
			}
			if n := count(t, db, d, `SELECT COUNT(*) FROM effects`); n != 1 {
				t.Errorf("%d effects, want 1", n)
			}

			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if res, err := tb.Fire(ctx, conn, int64(1), "pay"); err != nil || res.Version != 2 {
				t.Fatalf("pay on a Conn: %+v, %v", res, err)
			}
			if got := readOrder(t, conn, d, 1); got.Status != "PAID" {
				t.Errorf("after pay on a Conn the order is %+v", got)
			}
		})
	}
}

// TestTransitionRace: 50 callers move one order WAIT_PAY → PAID with the
// same expected version, each in a transaction that records a side effect
// when it made the transition: exactly one makes it, the others are told
// AlreadyApplied, the version moves once and one effect is recorded.
func TestTransitionRace(t *testing.T) {
	t.Parallel()
	const n = 50
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db, tb := fsmSchema(t, s)
			ctx := context.Background()
			d := s.dialect
			addOrder(t, db, d, 1, "WAIT_PAY", 1)
			var (
				made, already atomic.Int64
				start         = make(chan struct{})
				wg            sync.WaitGroup
			)
			for i := range n {
				wg.Go(func() {
					<-start
					err := inTransaction(ctx, db, func(tx *sql.Tx) error {
						res, err := tb.Transition(ctx, tx, int64(1), "PAID", fsm.IfVersion(1))
						if err != nil {
							return err
						}
						if res.AlreadyApplied {
							already.Add(1)
							return nil
						}
						made.Add(1)
						_, err = tx.ExecContext(ctx, rebind(d, `INSERT INTO effects (order_id, caller) VALUES (?, ?)`), 1, i)
						return err
					})
					if err != nil {
						t.Errorf("caller %d: %v", i, err)
					}
				})
			}
			close(start)
			wg.Wait()
			if made.Load() != 1 || already.Load() != n-1 {
				t.Errorf("%d made the transition and %d were told AlreadyApplied, want 1 and %d", made.Load(), already.Load(), n-1)
			}
			if got := readOrder(t, db, d, 1); got != (row{Status: "PAID", Version: 2}) {
				t.Errorf("the order is %+v, want PAID at version 2", got)
			}
			if e := count(t, db, d, `SELECT COUNT(*) FROM effects`); e != 1 {
				t.Errorf("%d side effects, want 1", e)
			}
		})
	}
}

// TestTransitionRacePayCancel: 25 callers pay and 25 cancel one waiting
// order: one wins; the callers with the winner's target are told
// AlreadyApplied, the others get an IllegalTransitionError that names the
// winner's state.
func TestTransitionRacePayCancel(t *testing.T) {
	t.Parallel()
	const n = 50
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db, tb := fsmSchema(t, s)
			ctx := context.Background()
			d := s.dialect
			addOrder(t, db, d, 1, "WAIT_PAY", 1)
			type outcome struct {
				to  fsm.State
				res fsm.Result
				err error
			}
			var (
				out   = make([]outcome, n)
				start = make(chan struct{})
				wg    sync.WaitGroup
			)
			for i := range n {
				to := fsm.State("PAID")
				if i%2 == 1 {
					to = "CANCELLED"
				}
				wg.Go(func() {
					<-start
					res, err := tb.Transition(ctx, db, int64(1), to)
					out[i] = outcome{to, res, err}
				})
			}
			close(start)
			wg.Wait()
			final := readOrder(t, db, d, 1)
			if final.Version != 2 || (final.Status != "PAID" && final.Status != "CANCELLED") {
				t.Fatalf("the order is %+v, want PAID or CANCELLED at version 2", final)
			}
			winners := 0
			for i, o := range out {
				var ie *fsm.IllegalTransitionError
				switch {
				case o.err == nil && !o.res.AlreadyApplied:
					winners++
					if o.to != final.Status {
						t.Errorf("caller %d made %s but the order is %s", i, o.to, final.Status)
					}
				case o.err == nil:
					if o.to != final.Status {
						t.Errorf("caller %d: AlreadyApplied for %s, the order is %s", i, o.to, final.Status)
					}
				case errors.As(o.err, &ie):
					if o.to == final.Status || ie.Current != final.Status || ie.Target != o.to {
						t.Errorf("caller %d (%s): %v; the order is %s", i, o.to, o.err, final.Status)
					}
				default:
					t.Errorf("caller %d (%s): %v", i, o.to, o.err)
				}
			}
			if winners != 1 {
				t.Errorf("%d winners, want 1", winners)
			}
		})
	}
}

// TestTransitionMySQLSnapshot: in a MariaDB REPEATABLE READ transaction
// whose snapshot saw the order waiting, another connection pays it; the
// transaction's own pay is then told AlreadyApplied — the read after the
// refused UPDATE locks, so it sees the committed row, not the snapshot
// (where the order still waits, which would read as a conflict).
func TestTransitionMySQLSnapshot(t *testing.T) {
	t.Parallel()
	s := servers[2]
	db, tb := fsmSchema(t, s)
	ctx := context.Background()
	addOrder(t, db, mysql, 1, "WAIT_PAY", 1)
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if got := readOrder(t, tx, mysql, 1); got.Status != "WAIT_PAY" { // takes the snapshot
		t.Fatalf("order: %+v", got)
	}
	if _, err := tb.Fire(ctx, db, int64(1), "pay"); err != nil {
		t.Fatal(err)
	}
	res, err := tb.Fire(ctx, tx, int64(1), "pay")
	if err != nil || !res.AlreadyApplied || res.Version != 2 {
		t.Fatalf("pay in the old snapshot: %+v, %v; want AlreadyApplied at version 2", res, err)
	}
}

// TestTransitionPostgresRepeatableRead: on PostgreSQL in a REPEATABLE READ
// transaction, an order changed by another transaction since the snapshot
// fails with SQLSTATE 40001, returned wrapped.
func TestTransitionPostgresRepeatableRead(t *testing.T) {
	t.Parallel()
	s := servers[0]
	db, tb := fsmSchema(t, s)
	ctx := context.Background()
	addOrder(t, db, postgres, 1, "NEW", 0)
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	readOrder(t, tx, postgres, 1) // takes the snapshot
	if _, err := tb.Fire(ctx, db, int64(1), "submit"); err != nil {
		t.Fatal(err)
	}
	_, err = tb.Fire(ctx, tx, int64(1), "cancel")
	var state interface{ SQLState() string }
	if !errors.As(err, &state) || state.SQLState() != "40001" {
		t.Fatalf("cancel in the old snapshot: %v; want SQLSTATE 40001", err)
	}
}
