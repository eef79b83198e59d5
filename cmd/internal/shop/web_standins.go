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
// POST /payments/callback) and cancelOrder (the fsm transition that gives
// stock and coupon back) exist, they run the stand-ins below, which have
// the same signatures and effects on the rows.

func (s *Shop) pageSimulatePayment(ctx context.Context, user int64, orderNo string) error {
	return s.standInSimulatePayment(ctx, user, orderNo)
}

func (s *Shop) pageCancelOrder(ctx context.Context, user int64, orderNo string) (Order, error) {
	return s.standInCancelOrder(ctx, user, orderNo)
}

// standInSimulatePayment applies a payment of the order's amount three
// times, as a provider repeats its callback: the first moves the order
// WAIT_PAY → PAID and writes the payment row, the others find it paid.
func (s *Shop) standInSimulatePayment(ctx context.Context, user int64, orderNo string) error {
	for range 3 {
		if err := s.standInApplyPayment(ctx, user, orderNo); err != nil {
			return err
		}
	}
	return nil
}

func (s *Shop) standInApplyPayment(ctx context.Context, user int64, orderNo string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	o, err := scanOrder(tx.QueryRowContext(ctx, s.q.getOrder, orderNo, user))
	if errors.Is(err, sql.ErrNoRows) {
		return &problemError{http.StatusNotFound, CodeNotFound, "No such order", "You have no order with this number."}
	}
	if err != nil {
		return err
	}
	now := time.Now().UnixMilli()
	res, err := tx.ExecContext(ctx, rebind(s.dialect, `UPDATE shop_orders SET status = 'PAID', version = version + 1, updated_ms = ?
		WHERE order_no = ? AND status = 'WAIT_PAY'`), now, orderNo)
	if err != nil {
		return err
	}
	switch n, err := res.RowsAffected(); {
	case err != nil:
		return err
	case n == 0:
		var status string
		if err := tx.QueryRowContext(ctx, rebind(s.dialect, `SELECT status FROM shop_orders WHERE order_no = ?`), orderNo).Scan(&status); err != nil {
			return err
		}
		if status == StatusPaid || status == StatusRefunded {
			return nil // paid already
		}
		return &problemError{http.StatusConflict, "ORDER_NOT_PAYABLE", "Order not payable",
			fmt.Sprintf("The order is %s; only an order waiting for its payment can be paid.", status)}
	}
	if _, err := tx.ExecContext(ctx, rebind(s.dialect, `INSERT INTO shop_payments (trade_no, order_no, amount_cents, created_ms) VALUES (?, ?, ?, ?)`),
		"sim_"+orderNo, orderNo, o.AmountCents, now); err != nil {
		return err
	}
	return tx.Commit()
}

// standInCancelOrder moves the order WAIT_PAY → CANCELLED and gives its
// stock and coupon back, once; an order cancelled already is answered as
// it is.
func (s *Shop) standInCancelOrder(ctx context.Context, user int64, orderNo string) (Order, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Order{}, err
	}
	defer tx.Rollback()
	now := time.Now().UnixMilli()
	res, err := tx.ExecContext(ctx, rebind(s.dialect, `UPDATE shop_orders SET status = 'CANCELLED', version = version + 1, updated_ms = ?
		WHERE order_no = ? AND user_id = ? AND status = 'WAIT_PAY'`), now, orderNo, user)
	if err != nil {
		return Order{}, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return Order{}, err
	}
	o, err := scanOrder(tx.QueryRowContext(ctx, s.q.getOrder, orderNo, user))
	if errors.Is(err, sql.ErrNoRows) {
		return Order{}, &problemError{http.StatusNotFound, CodeNotFound, "No such order", "You have no order with this number."}
	}
	if err != nil {
		return Order{}, err
	}
	if n == 0 {
		if o.Status == StatusCancelled {
			return o, nil
		}
		return Order{}, &problemError{http.StatusConflict, "ORDER_NOT_CANCELLABLE", "Order not cancellable",
			fmt.Sprintf("The order is %s; only an order waiting for its payment can be cancelled.", o.Status)}
	}
	if _, err := tx.ExecContext(ctx, rebind(s.dialect, `UPDATE shop_products SET stock = stock +
		(SELECT reserved_qty FROM shop_orders WHERE order_no = ?) WHERE sku = ?`), orderNo, o.SKU); err != nil {
		return Order{}, err
	}
	if _, err := tx.ExecContext(ctx, rebind(s.dialect, `UPDATE shop_coupon_claims SET status = 'UNUSED', order_no = NULL, version = version + 1
		WHERE order_no = ? AND status = 'USED'`), orderNo); err != nil {
		return Order{}, err
	}
	return o, tx.Commit()
}
