package guardtest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idemkit/idem/fsm"
)

// TestTransitionStatusExact: a status is matched byte for byte on every
// server. MariaDB's default collation (utf8mb4_general_ci) compares 'paid'
// equal to 'PAID' and 'Wait_Pay' to 'WAIT_PAY': a row in a state the
// machine does not declare must not move along an edge of a declared state
// that differs only in case, and the read after a refused UPDATE must
// agree with the UPDATE on what the row's state is.
func TestTransitionStatusExact(t *testing.T) {
	t.Parallel()
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db, tb := fsmSchema(t, s)
			ctx := context.Background()
			d := s.dialect
			addOrder(t, db, d, 1, "paid", 3)     // not a state of orderMachine
			addOrder(t, db, d, 2, "Wait_Pay", 3) // nor this

			var ie *fsm.IllegalTransitionError
			res, err := tb.Fire(ctx, db, int64(1), "ship")
			if !errors.As(err, &ie) || ie.Current != "paid" {
				t.Errorf("ship an order in the undeclared state 'paid': %+v, %v; want an IllegalTransitionError from \"paid\"", res, err)
			}
			if got := readOrder(t, db, d, 1); got.Status != "paid" || got.Version != 3 {
				t.Errorf("order 1 is %+v, want paid at version 3", got)
			}
			res, err = tb.Transition(ctx, db, int64(2), "PAID")
			if !errors.As(err, &ie) || ie.Current != "Wait_Pay" {
				t.Errorf("pay an order in the undeclared state 'Wait_Pay': %+v, %v; want an IllegalTransitionError from \"Wait_Pay\"", res, err)
			}
			if got := readOrder(t, db, d, 2); got.Status != "Wait_Pay" || got.Version != 3 {
				t.Errorf("order 2 is %+v, want Wait_Pay at version 3", got)
			}
		})
	}
}

// TestTransitionCharColumn: a status kept in a CHAR(n) column, which
// PostgreSQL pads with spaces when it is read: the retry of a transition
// is AlreadyApplied, and a refused one names the state without padding.
func TestTransitionCharColumn(t *testing.T) {
	t.Parallel()
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db := s.open(t)
			ctx := context.Background()
			d := s.dialect
			execAll(t, db, `CREATE TABLE orders (id BIGINT PRIMARY KEY, status CHAR(16) NOT NULL, version BIGINT NOT NULL)`)
			tb, err := fsm.NewTable(orderMachine, &fsm.TableConfig{Dialect: d, Table: "orders"})
			if err != nil {
				t.Fatal(err)
			}
			addOrder(t, db, d, 1, "WAIT_PAY", 1)
			if res, err := tb.Fire(ctx, db, int64(1), "pay"); err != nil || res.Version != 2 {
				t.Fatalf("pay: %+v, %v", res, err)
			}
			res, err := tb.Fire(ctx, db, int64(1), "pay")
			if err != nil || res != (fsm.Result{To: "PAID", Version: 2, AlreadyApplied: true}) {
				t.Errorf("pay again: %+v, %v; want AlreadyApplied at version 2", res, err)
			}
			var ie *fsm.IllegalTransitionError
			if _, err := tb.Fire(ctx, db, int64(1), "cancel"); !errors.As(err, &ie) || ie.Current != "PAID" {
				t.Errorf("cancel a paid order: %v; want an IllegalTransitionError from \"PAID\"", err)
			}
			if n := count(t, db, d, `SELECT COUNT(*) FROM orders WHERE version = 2`); n != 1 {
				t.Errorf("%d orders at version 2, want 1", n)
			}
		})
	}
}
