package shop

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/fsm"
	"github.com/idemkit/idem/sqlstore"
)

// orderMachine is the order's state machine, declared once (package
// fsm). Every change of an order's status goes through transitionOrder:
//
//	WAIT_PAY → PAID       the payment callback
//	WAIT_PAY → CHARGING   a card checkout begins (POST /orders/{order_no}/card-checkout)
//	CHARGING → PAID       the payment provider charged the card
//	CHARGING → WAIT_PAY   the payment provider declined the card
//	WAIT_PAY → CANCELLED  the owner (POST /orders/{order_no}/cancel)
//	WAIT_PAY → CLOSED     the close job, for orders unpaid for -pay-timeout
//	PAID      → REFUNDING  a refund begins (POST /orders/{order_no}/refunds)
//	REFUNDING → REFUNDED   the payment provider refunded it
//	REFUNDING → PAID       the payment provider refused the refund, for good
//
// CANCELLED, CLOSED and REFUNDED are final. A refund is an operation of
// steps (refund.go): an order stays REFUNDING while the provider's answer
// is unknown, until a retry or the completer learns it.
var orderMachine = fsm.MustNew(&fsm.Definition{
	States:  []fsm.State{StatusWaitPay, StatusCharging, StatusPaid, StatusCancelled, StatusClosed, StatusRefunding, StatusRefunded},
	Initial: StatusWaitPay,
	Final:   []fsm.State{StatusCancelled, StatusClosed, StatusRefunded},
	Transitions: []fsm.Transition{
		{Name: trPay, From: []fsm.State{StatusWaitPay}, To: StatusPaid},
		{Name: trCharge, From: []fsm.State{StatusWaitPay}, To: StatusCharging},
		{Name: trCharged, From: []fsm.State{StatusCharging}, To: StatusPaid},
		{Name: trDeclined, From: []fsm.State{StatusCharging}, To: StatusWaitPay},
		{Name: trCancel, From: []fsm.State{StatusWaitPay}, To: StatusCancelled},
		{Name: trClose, From: []fsm.State{StatusWaitPay}, To: StatusClosed},
		{Name: trRefund, From: []fsm.State{StatusPaid}, To: StatusRefunding},
		{Name: trRefunded, From: []fsm.State{StatusRefunding}, To: StatusRefunded},
		{Name: trRefused, From: []fsm.State{StatusRefunding}, To: StatusPaid},
	},
})

// newOrderTable binds orderMachine to shop_orders (keyed by order_no) in
// dialect d: fsm takes the store's dialect as it is.
func newOrderTable(d sqlstore.Dialect) (*fsm.Table, error) {
	return fsm.NewTable(orderMachine, &fsm.TableConfig{Dialect: d, Table: "shop_orders", ID: "order_no"})
}

// orderTransition is the outcome of transitionOrder.
type orderTransition struct {
	// From is the state the order left; "" when AlreadyApplied.
	From, To string
	// Version is the order's version after the transition.
	Version int64
	// AlreadyApplied: the order was in To already, nothing changed; the
	// caller must not repeat the transition's side effects (a give-back,
	// say): whoever moved it did them, in the transaction that moved it.
	AlreadyApplied bool
}

// errOrderNotFound: no order has this number.
var errOrderNotFound = errors.New("shop: no such order")

// illegalTransitionError: the order is in a state from which the
// transition is not allowed (a paid order cannot be cancelled).
type illegalTransitionError struct {
	OrderNo, Current, To string
}

func (e *illegalTransitionError) Error() string {
	return fmt.Sprintf("shop: order %s is %s; it cannot become %s", e.OrderNo, e.Current, e.To)
}

// conflictError: the order is still in a legal source state, but its
// version moved since the caller read it.
type conflictError struct {
	OrderNo       string
	Want, Current int64
}

func (e *conflictError) Error() string {
	return fmt.Sprintf("shop: order %s is at version %d, not %d: it changed concurrently", e.OrderNo, e.Current, e.Want)
}

// querier runs statements: *sql.DB and *sql.Tx.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Transitions of orderMachine, by name (transitionOrder fires them).
const (
	trPay      = "pay"
	trCharge   = "charge"
	trCharged  = "charged"
	trDeclined = "declined"
	trCancel   = "cancel"
	trClose    = "close"
	trRefund   = "refund"
	trRefunded = "refunded"
	trRefused  = "refused"
)

// transitionOrder makes the transition named name of orderNo through
// orderMachine: one conditional update (status in the transition's
// sources, and version = version when version is positive; updated_ms set
// in the same statement), in q (a transaction, so that the transition
// commits with its side effects). Only the named transition's sources
// move: a payment never moves a REFUNDING order to PAID, though "refused"
// leads there. When no row moved, fsm reads the row (a locking read on
// MySQL) and transitionOrder answers: already in the target →
// AlreadyApplied; another state → *illegalTransitionError; the version
// moved → *conflictError; no row → errOrderNotFound.
func (s *Shop) transitionOrder(ctx context.Context, q querier, orderNo, name string, version int64) (orderTransition, error) {
	tr, ok := orderMachine.Lookup(name)
	if !ok {
		return orderTransition{}, fmt.Errorf("shop: order transition %q is not declared", name)
	}
	to := string(tr.To)
	opts := []fsm.Option{fsm.Set("updated_ms", time.Now().UnixMilli())}
	if version > 0 {
		opts = append(opts, fsm.IfVersion(version))
	}
	r, err := s.orders.Fire(ctx, q, orderNo, name, opts...)
	var illegal *fsm.IllegalTransitionError
	var conflict *fsm.ConflictError
	switch {
	case err == nil:
		return orderTransition{From: string(r.Previous), To: string(r.To), Version: r.Version, AlreadyApplied: r.AlreadyApplied}, nil
	case errors.Is(err, fsm.ErrNotFound):
		return orderTransition{}, errOrderNotFound
	case errors.As(err, &illegal):
		return orderTransition{}, &illegalTransitionError{OrderNo: orderNo, Current: string(illegal.Current), To: to}
	case errors.As(err, &conflict):
		return orderTransition{}, &conflictError{OrderNo: orderNo, Want: version, Current: conflict.Version}
	}
	return orderTransition{}, fmt.Errorf("transition order to %s: %w", to, err)
}

// lockingRead is the suffix of a SELECT that reads the latest committed
// row and locks it for the transaction: under MySQL's REPEATABLE READ a
// plain read would see the transaction's snapshot.
func lockingRead(d sqlstore.Dialect) string {
	switch d {
	case sqlstore.MySQL:
		return ` LOCK IN SHARE MODE`
	case sqlstore.PostgreSQL:
		return ` FOR SHARE`
	}
	return ""
}

// forUpdate is the suffix of a SELECT that locks the rows it reads for an
// update to come (SQLite locks the whole database on the first write).
func forUpdate(d sqlstore.Dialect) string {
	if d == sqlstore.SQLite {
		return ""
	}
	return ` FOR UPDATE`
}

// dbNowMS is an SQL expression of the database's clock in unix
// milliseconds, constant within a statement (as sqlstore reads it): times
// that decide (an order's pay timeout) come from the database, never from
// a shopd process, whose clocks may disagree.
func dbNowMS(d sqlstore.Dialect) string {
	switch d {
	case sqlstore.PostgreSQL:
		return `floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint`
	case sqlstore.MySQL:
		// No session time zone involved (see sqlstore's MySQL queries).
		return `(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)`
	}
	return `CAST(unixepoch('subsec') * 1000 AS INTEGER)`
}
