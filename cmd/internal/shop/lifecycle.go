package shop

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
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
	sqlInsertRefund = `INSERT INTO shop_refunds (refund_no, order_no, amount_cents, status, created_ms) VALUES (?, ?, ?, ?, ?)`
	sqlGetRefund    = `SELECT refund_no, order_no, amount_cents, status FROM shop_refunds WHERE order_no = ?`
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
			t, err := s.transitionOrder(ctx, tx, orderNo, StatusCancelled, o.Version)
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

// Refund is a refund as the API shows it.
type Refund struct {
	RefundNo    string `json:"refund_no"`
	OrderNo     string `json:"order_no"`
	AmountCents int64  `json:"amount_cents"`
	Status      string `json:"status"`
}

// newRefundNo returns a random refund number, e.g. "ref_3f9c0a5e1b2d4c6f8a7e9b10".
func newRefundNo() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "ref_" + hex.EncodeToString(b[:])
}

// refundOrder refunds user's paid order orderNo in tx: it inserts the
// refund row, unique on the order (insert first; a duplicate reads the
// row that is there), and, when it created the row, moves the order PAID →
// REFUNDED with the version it read. It returns the refund and whether this
// call created it. Refusals are *problemError: NOT_FOUND,
// ORDER_NOT_REFUNDABLE (not paid).
func (s *Shop) refundOrder(ctx context.Context, tx *sql.Tx, user int64, orderNo string) (Refund, bool, error) {
	o, err := s.orderOf(ctx, tx, user, orderNo)
	if errors.Is(err, errOrderNotFound) {
		return Refund{}, false, problemOrderNotFound
	} else if err != nil {
		return Refund{}, false, err
	}
	notRefundable := func(status string) error {
		return &problemError{http.StatusConflict, CodeOrderNotRefundable, "Order not refundable",
			fmt.Sprintf("order %s is %s; only a paid order (PAID) can be refunded", orderNo, status)}
	}
	if o.Status != StatusPaid && o.Status != StatusRefunded {
		return Refund{}, false, notRefundable(o.Status)
	}
	ref := Refund{RefundNo: newRefundNo(), OrderNo: orderNo, AmountCents: o.AmountCents, Status: StatusRefunded}
	ref, created, err := insertOrGet(ctx, tx,
		func(ctx context.Context, q querier) (Refund, error) {
			_, err := q.ExecContext(ctx, rebind(s.dialect, sqlInsertRefund), ref.RefundNo, ref.OrderNo, ref.AmountCents, ref.Status, time.Now().UnixMilli())
			return ref, err
		},
		func(ctx context.Context, q querier) (Refund, error) {
			var got Refund
			err := q.QueryRowContext(ctx, rebind(s.dialect, sqlGetRefund+lockingRead(s.dialect)), orderNo).Scan(&got.RefundNo, &got.OrderNo, &got.AmountCents, &got.Status)
			return got, err
		})
	if err != nil {
		return Refund{}, false, fmt.Errorf("refund row: %w", err)
	}
	if !created {
		return ref, false, nil
	}
	t, err := s.transitionOrder(ctx, tx, orderNo, StatusRefunded, o.Version)
	var illegal *illegalTransitionError
	switch {
	case errors.As(err, &illegal):
		return Refund{}, false, notRefundable(illegal.Current)
	case err != nil:
		// A conflict cannot happen (only a refund moves a paid order,
		// and the refund row this call holds excludes another); report
		// it as the failure it would be.
		return Refund{}, false, err
	case t.AlreadyApplied:
		return Refund{}, false, fmt.Errorf("shop: order %s is REFUNDED without a refund row", orderNo)
	}
	if err := s.addEvent(ctx, tx, EventOrderRefunded, orderNo); err != nil {
		return Refund{}, false, err
	}
	return ref, true, nil
}

func (s *Shop) refundHandler(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var resp idem.Response
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		ref, created, err := s.refundOrder(ctx, tx, userFrom(ctx), r.PathValue("order_no"))
		if err != nil {
			return err
		}
		status := http.StatusOK
		if created {
			status = http.StatusCreated
		}
		if resp, err = idemhttp.JSONResponse(status, ref); err != nil {
			return err
		}
		// The stored answer commits with the refund, or neither does.
		if exec := idemhttp.ExecutionFrom(ctx); exec != nil {
			return exec.CompleteTx(ctx, tx, resp)
		}
		return nil
	})
	switch {
	case errors.Is(err, idem.ErrLeaseLost):
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusConflict, idemhttp.CodeProcessing, "Request in progress",
			"another execution of this request took over; retry to get its answer")
	case err != nil:
		s.answerError(w, r, "refund order", err)
	default:
		idemhttp.WriteResponse(w, resp)
	}
}
