package shop

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem/sqlstore"
)

// The order's state machine, declared once. Every change of an order's
// status goes through transitionOrder:
//
//	WAIT_PAY → PAID       the payment callback
//	WAIT_PAY → CANCELLED  the owner (POST /orders/{order_no}/cancel)
//	WAIT_PAY → CLOSED     the close job, for orders unpaid for -pay-timeout
//	PAID     → REFUNDED   a refund (POST /orders/{order_no}/refunds)
//
// CANCELLED, CLOSED and REFUNDED are final.
var orderSources = map[string][]string{ // target → the states it may be reached from
	StatusPaid:      {StatusWaitPay},
	StatusCancelled: {StatusWaitPay},
	StatusClosed:    {StatusWaitPay},
	StatusRefunded:  {StatusPaid},
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

// transitionOrder moves order orderNo to `to` with one conditional update
// (status in the legal sources of to, and version = version when version
// is positive), in q (a transaction, so that the transition commits with
// its side effects). When no row moved, it reads the row (a locking read,
// so that a MySQL transaction sees the latest committed state and not its
// snapshot) and answers: already in to → AlreadyApplied; another state →
// *illegalTransitionError; the version moved → *conflictError; no row →
// errOrderNotFound.
func (s *Shop) transitionOrder(ctx context.Context, q querier, orderNo, to string, version int64) (orderTransition, error) {
	from, ok := orderSources[to]
	if !ok {
		return orderTransition{}, fmt.Errorf("shop: %s is no target of the order machine", to)
	}
	stmt := `UPDATE shop_orders SET status = ?, version = version + 1, updated_ms = ? WHERE order_no = ? AND status IN (?` +
		strings.Repeat(", ?", len(from)-1) + `)`
	args := []any{to, time.Now().UnixMilli(), orderNo}
	for _, f := range from {
		args = append(args, f)
	}
	if version > 0 {
		stmt += ` AND version = ?`
		args = append(args, version)
	}
	res, err := q.ExecContext(ctx, rebind(s.dialect, stmt), args...)
	if err != nil {
		return orderTransition{}, fmt.Errorf("transition order to %s: %w", to, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return orderTransition{}, fmt.Errorf("transition order to %s: %w", to, err)
	}
	read := `SELECT status, version FROM shop_orders WHERE order_no = ?` + lockingRead(s.dialect)
	var current string
	var v int64
	switch err := q.QueryRowContext(ctx, rebind(s.dialect, read), orderNo).Scan(&current, &v); {
	case errors.Is(err, sql.ErrNoRows):
		return orderTransition{}, errOrderNotFound
	case err != nil:
		return orderTransition{}, fmt.Errorf("read order after transition: %w", err)
	}
	if n == 1 {
		// The row moved; from was one of the sources (a single source for
		// every target of this machine).
		return orderTransition{From: from[0], To: to, Version: v}, nil
	}
	switch {
	case current == to:
		return orderTransition{To: to, Version: v, AlreadyApplied: true}, nil
	case version > 0 && v != version && slices.Contains(from, current):
		return orderTransition{}, &conflictError{OrderNo: orderNo, Want: version, Current: v}
	}
	return orderTransition{}, &illegalTransitionError{OrderNo: orderNo, Current: current, To: to}
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
