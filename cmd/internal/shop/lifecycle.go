package shop

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"time"

	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/uniq"
)

// An order's life after it is placed: the owner cancels it, the close job
// closes it unpaid, a paid order is refunded. Cancelling and closing give
// the order's reserved stock back and its coupon claim back to UNUSED, in
// the transaction of the transition, and only when the transition moved
// the order (not when it was AlreadyApplied): whoever moves the order
// gives back, once.

// Statements of the order's life, written with ? (rebind).
const (
	sqlOrderHoldings = `SELECT sku, user_id, reserved_qty, coupon_id FROM shop_orders WHERE order_no = ?`
	sqlRestock       = `UPDATE shop_products SET stock = stock + ? WHERE sku = ?`
	// The claim the order used, and only that one, becomes usable again.
	sqlReleaseClaim = `UPDATE shop_coupon_claims SET status = 'UNUSED', order_no = NULL, version = version + 1
		WHERE user_id = ? AND coupon_id = ? AND status = 'USED' AND order_no = ?`
)

// The retry policy of every transaction the shop runs: a transaction the
// database refused as a deadlock victim or could not serialise runs again,
// whole, up to txAttempts times, after a pause drawn uniformly from
// [0, min(txBackoffCap, txBackoffBase·2^(attempt-1))) (exponential backoff
// with full jitter). Enough for a burst of a few hundred transactions on
// one row under a REPEATABLE READ or SERIALIZABLE default, where all but
// one of the waiters on the row's lock fail each round.
const (
	txAttempts    = 30
	txBackoffBase = time.Millisecond
	txBackoffCap  = 100 * time.Millisecond
)

// retryable reports whether err means that the whole transaction may
// simply run again: sqlstore's classification (a PostgreSQL serialisation
// failure or deadlock, a MySQL deadlock), or uniq's ErrNotVisible (an
// insert met a row committed after the transaction's snapshot, which uniq
// documents as "retry the transaction"). uniq's ErrUnresolved (another
// constraint, a get that cannot find the row) is a bug: not retried.
func retryable(err error) bool {
	return sqlstore.Retryable(err) || errors.Is(err, uniq.ErrNotVisible)
}

// retryTx runs attempt, and again under the retry policy while it fails
// with a retryable error, until ctx ends. attempt must run a whole
// transaction (begin to commit), so that running it again redoes all of
// it. The last error is returned.
func (s *Shop) retryTx(ctx context.Context, attempt func() error) error {
	for n := 1; ; n++ {
		err := attempt()
		if err == nil || !retryable(err) || n == txAttempts || ctx.Err() != nil {
			return err
		}
		s.log.DebugContext(ctx, "shop: transaction retried", "attempt", n, "error", err)
		t := time.NewTimer(txBackoff(n))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// txBackoff is the pause after the n-th failed attempt (full jitter).
func txBackoff(n int) time.Duration {
	ceil := txBackoffCap
	if n <= 7 { // 2^7 ms > the cap
		ceil = min(txBackoffCap, txBackoffBase<<(n-1))
	}
	return mrand.N(ceil)
}

// inTx runs fn in a transaction and commits it, under the retry policy
// (retryTx): fn runs again, in a new transaction, when the database
// refuses it as a deadlock victim or could not serialise it. fn's
// refusals (*problemError) and other errors roll back.
func (s *Shop) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return s.retryTx(ctx, func() error { return s.tryTx(ctx, fn) })
}

func (s *Shop) tryTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// giveBack returns what order orderNo holds: its reserved quantity to its
// product's stock, and its coupon claim to UNUSED. Call it in the
// transaction that moved the order to CANCELLED or CLOSED, and only when
// that transition was not AlreadyApplied.
func (s *Shop) giveBack(ctx context.Context, tx *sql.Tx, orderNo string) error {
	var sku string
	var user, reserved int64
	var coupon sql.NullInt64
	if err := tx.QueryRowContext(ctx, rebind(s.dialect, sqlOrderHoldings), orderNo).Scan(&sku, &user, &reserved, &coupon); err != nil {
		return fmt.Errorf("read order holdings: %w", err)
	}
	if reserved > 0 {
		if _, err := tx.ExecContext(ctx, rebind(s.dialect, sqlRestock), reserved, sku); err != nil {
			return fmt.Errorf("give stock back: %w", err)
		}
	}
	if coupon.Valid {
		if _, err := tx.ExecContext(ctx, rebind(s.dialect, sqlReleaseClaim), user, coupon.Int64, orderNo); err != nil {
			return fmt.Errorf("give coupon back: %w", err)
		}
	}
	return nil
}

// orderOf reads user's order orderNo in q: errOrderNotFound when there is
// none or it is another user's.
func (s *Shop) orderOf(ctx context.Context, q querier, user int64, orderNo string) (Order, error) {
	if !orderNoPattern.MatchString(orderNo) {
		return Order{}, errOrderNotFound
	}
	o, err := scanOrder(q.QueryRowContext(ctx, s.q.getOrder, orderNo, user))
	if errors.Is(err, sql.ErrNoRows) {
		return Order{}, errOrderNotFound
	}
	return o, err
}

var problemOrderNotFound = &problemError{http.StatusNotFound, CodeNotFound, "Not found", "no such order"}

// cancelOrder cancels user's order orderNo: WAIT_PAY → CANCELLED with the
// order's version, and in the same transaction its stock and coupon given
// back, once. An order cancelled already is returned as it is (nothing
// given back again). Refusals are *problemError: NOT_FOUND (no such order,
// or another user's), ORDER_NOT_CANCELLABLE (paid, refunded or closed).
func (s *Shop) cancelOrder(ctx context.Context, user int64, orderNo string) (Order, error) {
	var order Order
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		for {
			o, err := s.orderOf(ctx, tx, user, orderNo)
			if errors.Is(err, errOrderNotFound) {
				return problemOrderNotFound
			} else if err != nil {
				return err
			}
			t, err := s.transitionOrder(ctx, tx, orderNo, trCancel, o.Version)
			var illegal *illegalTransitionError
			var conflict *conflictError
			switch {
			case errors.As(err, &illegal):
				return &problemError{http.StatusConflict, CodeOrderNotCancellable, "Order not cancellable",
					fmt.Sprintf("order %s is %s; only an order waiting for its payment (WAIT_PAY) can be cancelled", orderNo, illegal.Current)}
			case errors.As(err, &conflict):
				continue // read it again
			case err != nil:
				return err
			}
			if !t.AlreadyApplied {
				if err := s.giveBack(ctx, tx, orderNo); err != nil {
					return err
				}
				if err := s.addEvent(ctx, tx, EventOrderCancelled, orderNo); err != nil {
					return err
				}
			}
			o.Status, o.Version = StatusCancelled, t.Version
			order = o
			return nil
		}
	})
	return order, err
}

func (s *Shop) cancelHandler(w http.ResponseWriter, r *http.Request) {
	o, err := s.cancelOrder(r.Context(), userFrom(r.Context()), r.PathValue("order_no"))
	if err != nil {
		s.answerError(w, r, "cancel order", err)
		return
	}
	writeJSON(w, http.StatusOK, o)
}
