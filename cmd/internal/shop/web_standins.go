package shop

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// The order page's buttons call pageSimulatePayment and pageCancelOrder.
// Until the shop's own simulatePayment (signed callbacks to
// POST /payments/callback) exists, the payment runs the stand-in below,
// with the same signature and the same effect on the rows.

func (s *Shop) pageSimulatePayment(ctx context.Context, user int64, orderNo string) error {
	return s.standInSimulatePayment(ctx, user, orderNo)
}

func (s *Shop) pageCancelOrder(ctx context.Context, user int64, orderNo string) (Order, error) {
	return s.cancelOrder(ctx, user, orderNo)
}

// standInSimulatePayment applies a payment of the order's amount three
// times, as a provider repeats its callback: the first moves the order
// WAIT_PAY → PAID and writes the payment row in one transaction, the
// others find it paid.
func (s *Shop) standInSimulatePayment(ctx context.Context, user int64, orderNo string) error {
	for range 3 {
		if err := s.inTx(ctx, func(tx *sql.Tx) error { return s.standInApplyPayment(ctx, tx, user, orderNo) }); err != nil {
			return err
		}
	}
	return nil
}

func (s *Shop) standInApplyPayment(ctx context.Context, tx *sql.Tx, user int64, orderNo string) error {
	o, err := s.orderOf(ctx, tx, user, orderNo)
	if errors.Is(err, errOrderNotFound) {
		return problemOrderNotFound
	} else if err != nil {
		return err
	}
	t, err := s.transitionOrder(ctx, tx, orderNo, StatusPaid, o.Version)
	var illegal *illegalTransitionError
	switch {
	case errors.As(err, &illegal):
		if illegal.Current == StatusRefunded {
			return nil // paid, then refunded
		}
		return &problemError{http.StatusConflict, "ORDER_NOT_PAYABLE", "Order not payable",
			fmt.Sprintf("order %s is %s; only an order waiting for its payment can be paid", orderNo, illegal.Current)}
	case err != nil:
		return err
	case t.AlreadyApplied:
		return nil
	}
	_, err = tx.ExecContext(ctx, rebind(s.dialect, `INSERT INTO shop_payments (trade_no, order_no, amount_cents, created_ms) VALUES (?, ?, ?, ?)`),
		"sim_"+orderNo, orderNo, o.AmountCents, time.Now().UnixMilli())
	return err
}
