package shop_test

import (
	"database/sql"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/sqlstore"
)

// orderRow is what the database holds of an order, and of its claim.
type orderRow struct {
	Status           string
	Version          int64
	ClaimStatus      string
	ClaimOrder       string
	Stock            int64
	Refunds, Claimed int
}

func readOrderRow(t *testing.T, db *sql.DB, d sqlstore.Dialect, orderNo string, user int64) orderRow {
	t.Helper()
	var r orderRow
	q := func(s string) string {
		if d == sqlstore.PostgreSQL {
			return "SELECT status, version FROM shop_orders WHERE order_no = $1"
		}
		return s
	}
	if err := db.QueryRow(q(`SELECT status, version FROM shop_orders WHERE order_no = ?`), orderNo).Scan(&r.Status, &r.Version); err != nil {
		t.Fatal(err)
	}
	var claimOrder sql.NullString
	err := db.QueryRow(`SELECT status, order_no FROM shop_coupon_claims WHERE coupon_id = 1 AND user_id = `+strconv.FormatInt(user, 10)).Scan(&r.ClaimStatus, &claimOrder)
	if err != nil && err != sql.ErrNoRows {
		t.Fatal(err)
	}
	r.ClaimOrder = claimOrder.String
	r.Stock = stockOf(t, db, d, "SKU-1")
	r.Refunds = countRows(t, db, `SELECT COUNT(*) FROM shop_refunds WHERE order_no = '`+orderNo+`'`)
	r.Claimed = countRows(t, db, `SELECT claimed FROM shop_coupons WHERE id = 1`)
	return r
}

// setPaid marks an order paid, as the payment callback does.
func setPaid(t *testing.T, db *sql.DB, orderNo string) {
	t.Helper()
	mustExec(t, db, `UPDATE shop_orders SET status = 'PAID', version = version + 1 WHERE order_no = '`+orderNo+`' AND status = 'WAIT_PAY'`)
}

// orderWithCoupon claims coupon 1 for user and orders 3 SKU-1 with it.
func orderWithCoupon(t *testing.T, s http.Handler, user int64, key string) shop.Order {
	t.Helper()
	if status, _, code := claimCoupon(t, s, user, "1"); status != 201 && status != 200 {
		t.Fatalf("claim: %d %s", status, code)
	}
	status, o, code := postOrder(t, s, user, key, `{"sku":"SKU-1","quantity":3,"coupon_id":1}`)
	if status != 201 {
		t.Fatalf("order: %d %s", status, code)
	}
	return o
}

func cancel(t *testing.T, s http.Handler, user int64, orderNo string) (int, shop.Order, string) {
	t.Helper()
	rec := serve(s, "POST", "/orders/"+orderNo+"/cancel", map[string]string{"X-User-ID": strconv.FormatInt(user, 10)}, "")
	if rec.Code != 200 {
		return rec.Code, shop.Order{}, problemCode(t, rec)
	}
	var o shop.Order
	if err := json.Unmarshal(rec.Body.Bytes(), &o); err != nil {
		t.Fatal(err)
	}
	return rec.Code, o, ""
}

// The owner cancels a waiting order: CANCELLED, its stock and its coupon
// claim given back; cancelling again answers the cancelled order and gives
// nothing back again (the claim, used meanwhile by another order, stays
// with that order); another user's order is 404; a paid order is 409
// ORDER_NOT_CANCELLABLE and keeps its stock.
func TestCancelOrder(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, db := newShop(t, b)
		o := orderWithCoupon(t, s, 5, "first")
		if r := readOrderRow(t, db, b.dialect, o.OrderNo, 5); r.Stock != 97 || r.ClaimStatus != "USED" || r.ClaimOrder != o.OrderNo {
			t.Fatalf("before cancel: %+v", r)
		}
		if status, _, code := cancel(t, s, 6, o.OrderNo); status != 404 || code != "NOT_FOUND" {
			t.Fatalf("another user's cancel: %d %s", status, code)
		}
		if status, _, code := cancel(t, s, 5, "ord_nope"); status != 404 || code != "NOT_FOUND" {
			t.Fatalf("cancel of no order: %d %s", status, code)
		}
		status, got, _ := cancel(t, s, 5, o.OrderNo)
		if status != 200 || got.Status != "CANCELLED" || got.OrderNo != o.OrderNo || got.Version != 2 || got.AmountCents != o.AmountCents {
			t.Fatalf("cancel: %d %+v", status, got)
		}
		if r := readOrderRow(t, db, b.dialect, o.OrderNo, 5); r.Status != "CANCELLED" || r.Version != 2 || r.Stock != 100 || r.ClaimStatus != "UNUSED" || r.ClaimOrder != "" {
			t.Fatalf("after cancel: %+v", r)
		}

		// The claim serves another order; a repeated cancel of the first
		// must leave it there.
		o2 := orderWithCoupon(t, s, 5, "second")
		status, again, _ := cancel(t, s, 5, o.OrderNo)
		if status != 200 || again.Status != "CANCELLED" || again.Version != 2 {
			t.Fatalf("second cancel: %d %+v", status, again)
		}
		if r := readOrderRow(t, db, b.dialect, o.OrderNo, 5); r.Version != 2 || r.Stock != 97 || r.ClaimStatus != "USED" || r.ClaimOrder != o2.OrderNo {
			t.Fatalf("after the second cancel: %+v, want version 2, stock 97, claim USED by %s", r, o2.OrderNo)
		}

		setPaid(t, db, o2.OrderNo)
		if status, _, code := cancel(t, s, 5, o2.OrderNo); status != 409 || code != "ORDER_NOT_CANCELLABLE" {
			t.Fatalf("cancel of a paid order: %d %s", status, code)
		}
		if r := readOrderRow(t, db, b.dialect, o2.OrderNo, 5); r.Status != "PAID" || r.Stock != 97 || r.ClaimStatus != "USED" {
			t.Fatalf("paid order after a refused cancel: %+v", r)
		}
		if rec := serve(s, "POST", "/orders/"+o2.OrderNo+"/cancel", nil, ""); rec.Code != 401 {
			t.Fatalf("cancel without a user: %d", rec.Code)
		}
	})
}

// 20 concurrent cancels of one order: all answer the cancelled order, the
// order moved once (version 2), its stock came back once and its claim is
// UNUSED.
func TestConcurrentCancels(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, db := newShop(t, b)
		o := orderWithCoupon(t, s, 5, "k")
		const n = 20
		statuses := make([]int, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				var got shop.Order
				statuses[i], got, _ = cancel(t, s, 5, o.OrderNo)
				if got.Status != "CANCELLED" {
					statuses[i] = -statuses[i]
				}
			})
		}
		close(start)
		wg.Wait()
		for i, st := range statuses {
			if st != 200 {
				t.Errorf("cancel %d: %d", i, st)
			}
		}
		if r := readOrderRow(t, db, b.dialect, o.OrderNo, 5); r.Status != "CANCELLED" || r.Version != 2 || r.Stock != 100 || r.ClaimStatus != "UNUSED" || r.Claimed != 1 {
			t.Fatalf("after %d cancels: %+v, want CANCELLED at version 2, stock 100, claim UNUSED", n, r)
		}
	})
}

func refund(t *testing.T, s http.Handler, user int64, key, orderNo string) (int, shop.Refund, string, string) {
	t.Helper()
	h := map[string]string{"X-User-ID": strconv.FormatInt(user, 10)}
	if key != "" {
		h["Idempotency-Key"] = key
	}
	rec := serve(s, "POST", "/orders/"+orderNo+"/refunds", h, "")
	if rec.Code != 200 && rec.Code != 201 {
		return rec.Code, shop.Refund{}, problemCode(t, rec), ""
	}
	var r shop.Refund
	if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	return rec.Code, r, "", rec.Header().Get("Idempotent-Replayed")
}

// A paid order is refunded once: 201 with the refund, its replay under the
// same key, 200 with the same refund under another key; one refund row;
// the order REFUNDED. An unpaid or cancelled order is 409
// ORDER_NOT_REFUNDABLE; another user's order 404; no key 400.
func TestRefundOrder(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, db := newShop(t, b)
		_, o, _ := postOrder(t, s, 5, "order", `{"sku":"SKU-1","quantity":2}`)
		if status, _, code, _ := refund(t, s, 5, "r0", o.OrderNo); status != 409 || code != "ORDER_NOT_REFUNDABLE" {
			t.Fatalf("refund of an unpaid order: %d %s", status, code)
		}
		if status, _, code, _ := refund(t, s, 5, "", o.OrderNo); status != 400 || code != "MISSING_KEY" {
			t.Fatalf("refund without a key: %d %s", status, code)
		}
		setPaid(t, db, o.OrderNo)
		if status, _, code, _ := refund(t, s, 6, "r1", o.OrderNo); status != 404 || code != "NOT_FOUND" {
			t.Fatalf("another user's refund: %d %s", status, code)
		}
		status, ref, _, _ := refund(t, s, 5, "r1", o.OrderNo)
		if status != 201 || ref.OrderNo != o.OrderNo || ref.AmountCents != 2*1299 || ref.Status != "REFUNDED" || ref.RefundNo == "" {
			t.Fatalf("refund: %d %+v", status, ref)
		}
		status, replay, _, replayed := refund(t, s, 5, "r1", o.OrderNo)
		if status != 201 || replay != ref || replayed != "true" {
			t.Fatalf("replay: %d %+v replayed=%q", status, replay, replayed)
		}
		status, other, _, replayed := refund(t, s, 5, "r2", o.OrderNo)
		if status != 200 || other != ref || replayed != "" {
			t.Fatalf("another key: %d %+v replayed=%q, want 200 with %+v", status, other, replayed, ref)
		}
		// PAID (2) → REFUNDING (3) → REFUNDED (4).
		if r := readOrderRow(t, db, b.dialect, o.OrderNo, 5); r.Status != "REFUNDED" || r.Version != 4 || r.Refunds != 1 {
			t.Fatalf("after refunds: %+v", r)
		}
		var refundNo string
		var amount int64
		if err := db.QueryRow(`SELECT refund_no, amount_cents FROM shop_refunds WHERE order_no = '`+o.OrderNo+`'`).Scan(&refundNo, &amount); err != nil || refundNo != ref.RefundNo || amount != ref.AmountCents {
			t.Fatalf("refund row %s %d (%v), want %+v", refundNo, amount, err, ref)
		}
		// A cancelled order is no refund's business either.
		_, o2, _ := postOrder(t, s, 5, "order2", `{"sku":"SKU-1","quantity":1}`)
		cancel(t, s, 5, o2.OrderNo)
		if status, _, code, _ := refund(t, s, 5, "r3", o2.OrderNo); status != 409 || code != "ORDER_NOT_REFUNDABLE" {
			t.Fatalf("refund of a cancelled order: %d %s", status, code)
		}
		if n := countRows(t, db, `SELECT COUNT(*) FROM shop_refunds`); n != 1 {
			t.Fatalf("%d refund rows, want 1", n)
		}
	})
}

// 10 refunds of one paid order at once, each with its own key: one refund
// row, one 201, nine 200 with the same refund. A refund that meets
// another in progress is 409 REFUND_IN_PROGRESS, not stored: its client
// retries with the same key until it gets the refund.
func TestConcurrentRefunds(t *testing.T) {
	forIsolations(t, func(t *testing.T, b backend) {
		s, db := newShop(t, b)
		_, o, _ := postOrder(t, s, 5, "order", `{"sku":"BOOK-1","quantity":1}`)
		setPaid(t, db, o.OrderNo)
		const n = 10
		statuses := make([]int, n)
		refunds := make([]shop.Refund, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				for {
					var code string
					statuses[i], refunds[i], code, _ = refund(t, s, 5, "key-"+strconv.Itoa(i), o.OrderNo)
					if statuses[i] != 409 || code != shop.CodeRefundInProgress {
						return
					}
					time.Sleep(5 * time.Millisecond) // pacing only: the loop ends on an answer
				}
			})
		}
		close(start)
		wg.Wait()
		created := 0
		for i := range n {
			switch {
			case statuses[i] == 201:
				created++
			case statuses[i] != 200:
				t.Errorf("refund %d: %d", i, statuses[i])
			}
			if refunds[i] != refunds[0] || refunds[i].RefundNo == "" {
				t.Errorf("refund %d: %+v, refund 0: %+v", i, refunds[i], refunds[0])
			}
		}
		if created != 1 {
			t.Errorf("%d answers 201, want 1", created)
		}
		if r := readOrderRow(t, db, b.dialect, o.OrderNo, 5); r.Status != "REFUNDED" || r.Version != 4 || r.Refunds != 1 {
			t.Fatalf("after %d refunds: %+v", n, r)
		}
	})
}
