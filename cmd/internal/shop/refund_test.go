package shop_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/payprov"
	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/steps"
)

// refundRig is a shop whose refunds go to a provider the test controls.
type refundRig struct {
	s        *shop.Shop
	db       *sql.DB
	provider *payprov.Client
}

// newRefundRig returns a shop over a fresh database of b, with a provider
// whose client times out after a second and a completer whose backoff is
// short (Runner.Complete is the test's to call).
func newRefundRig(t *testing.T, b backend) *refundRig {
	t.Helper()
	c, _ := newProvider(t)
	bounded := &payprov.Client{BaseURL: c.BaseURL, HTTP: &http.Client{Timeout: time.Second}}
	db, _ := b.fresh(t)
	s := shopOnWith(t, db, b.dialect, shop.DefaultCatalog(), func(cfg *shop.Config) {
		cfg.Provider = bounded
		cfg.Steps = &steps.Config{Backoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
	})
	return &refundRig{s: s, db: db, provider: c}
}

// paidOrder places an order of 2 SKU-1 for user 5 and marks it paid.
func (r *refundRig) paidOrder(t *testing.T, key string) shop.Order {
	t.Helper()
	_, o, _ := postOrder(t, r.s, 5, key, `{"sku":"SKU-1","quantity":2}`)
	setPaid(t, r.db, o.OrderNo)
	return o
}

// post sends POST /orders/{orderNo}/refunds as user 5 with key.
func (r *refundRig) post(orderNo, key string) *httptest.ResponseRecorder {
	return serve(r.s, "POST", "/orders/"+orderNo+"/refunds", map[string]string{"X-User-ID": "5", "Idempotency-Key": key}, "")
}

// refundState is what the shop and the provider hold of an order's refund.
type refundState struct {
	Order      string // the order's status
	Rows       int    // refund rows
	Row        string // the row's status
	ProviderID string // the row's provider_refund_id
	Events     int    // order.refunded events in the outbox
	Ledger     int    // refunds the provider made of the order's payment
}

func (r *refundRig) state(t *testing.T, orderNo string) refundState {
	t.Helper()
	var st refundState
	if err := r.db.QueryRow(`SELECT status FROM shop_orders WHERE order_no = '` + orderNo + `'`).Scan(&st.Order); err != nil {
		t.Fatal(err)
	}
	st.Rows = countRows(t, r.db, `SELECT COUNT(*) FROM shop_refunds WHERE order_no = '`+orderNo+`'`)
	if st.Rows == 1 {
		var id sql.NullString
		if err := r.db.QueryRow(`SELECT status, provider_refund_id FROM shop_refunds WHERE order_no = '`+orderNo+`'`).Scan(&st.Row, &id); err != nil {
			t.Fatal(err)
		}
		st.ProviderID = id.String
	}
	st.Events = countRows(t, r.db, `SELECT COUNT(*) FROM idem_outbox WHERE topic = 'order.refunded' AND msg_key = '`+orderNo+`'`)
	st.Ledger = ledgerRefunds(t, r.provider, orderNo)
	return st
}

// completeOne runs the completer's passes until one finished an
// operation: it is due after the runner's backoff (10 ms here).
func (r *refundRig) completeOne(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p, err := r.s.Runner().Complete(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if p.Finished == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the completer finished nothing: %+v", p)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ledgerRefunds counts the refunds the provider made of payment.
func ledgerRefunds(t *testing.T, c *payprov.Client, payment string) int {
	t.Helper()
	l, err := c.Ledger(context.Background(), payprov.KindRefund)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range l.Effects {
		var re payprov.Refund
		if err := json.Unmarshal(e.Object, &re); err != nil {
			t.Fatal(err)
		}
		if re.Payment == payment {
			n++
		}
	}
	return n
}

// done is the state of an order refunded once.
func done(st refundState) bool {
	return st.Order == shop.StatusRefunded && st.Rows == 1 && st.Row == shop.StatusRefunded && st.ProviderID != "" && st.Events == 1 && st.Ledger == 1
}

// decodeRefund reads a 2xx answer's Refund.
func decodeRefund(t *testing.T, rec *httptest.ResponseRecorder) shop.Refund {
	t.Helper()
	var ref shop.Refund
	if err := json.Unmarshal(rec.Body.Bytes(), &ref); err != nil {
		t.Fatalf("refund body %q: %v", rec.Body, err)
	}
	return ref
}

// A refund goes through the provider once: 201 with the provider's
// refund id, the order REFUNDED, one row, one event; the retry replays
// the same bytes without calling the provider again.
func TestRefundThroughProvider(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		r := newRefundRig(t, b)
		o := r.paidOrder(t, "o1")
		first := r.post(o.OrderNo, "r1")
		if first.Code != http.StatusCreated {
			t.Fatalf("refund: %d %s", first.Code, first.Body)
		}
		ref := decodeRefund(t, first)
		if ref.Status != shop.StatusRefunded || ref.AmountCents != 2*1299 || ref.ProviderRefundID == "" {
			t.Fatalf("refund: %+v", ref)
		}
		again := r.post(o.OrderNo, "r1")
		if again.Code != http.StatusCreated || !bytes.Equal(again.Body.Bytes(), first.Body.Bytes()) || again.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry: %d %s (replayed %q), want the first answer replayed", again.Code, again.Body, again.Header().Get("Idempotent-Replayed"))
		}
		if st := r.state(t, o.OrderNo); !done(st) || st.ProviderID != ref.ProviderRefundID {
			t.Fatalf("after the refund and its retry: %+v", st)
		}
		l, err := r.provider.Ledger(context.Background(), payprov.KindRefund)
		if err != nil || len(l.Keys) != 1 || l.Keys[0].Requests != 1 {
			t.Fatalf("provider keys %+v (%v), want one key asked once", l.Keys, err)
		}
	})
}

// The provider fails: 503 PROVIDER_UNAVAILABLE with Retry-After, the
// order REFUNDING, nothing refunded; the retry with the same key refunds.
func TestRefundProviderFails(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		r := newRefundRig(t, b)
		o := r.paidOrder(t, "o1")
		if err := r.provider.SetFault(context.Background(), payprov.Fault{Path: "/v1/refunds", Mode: payprov.FaultFail, Count: 1}); err != nil {
			t.Fatal(err)
		}
		rec := r.post(o.OrderNo, "r1")
		if rec.Code != http.StatusServiceUnavailable || problemCode(t, rec) != shop.CodeProviderUnavailable || rec.Header().Get("Retry-After") == "" {
			t.Fatalf("refund while the provider fails: %d %s %v", rec.Code, rec.Body, rec.Header())
		}
		if st := r.state(t, o.OrderNo); st.Order != shop.StatusRefunding || st.Row != shop.StatusRefunding || st.Ledger != 0 || st.Events != 0 {
			t.Fatalf("after the failure: %+v", st)
		}
		// Another key meanwhile: the refund is in progress, not stored.
		if rec := r.post(o.OrderNo, "other"); rec.Code != http.StatusConflict || problemCode(t, rec) != shop.CodeRefundInProgress || rec.Header().Get("Retry-After") == "" {
			t.Fatalf("another key while REFUNDING: %d %s", rec.Code, rec.Body)
		}
		if rec := r.post(o.OrderNo, "r1"); rec.Code != http.StatusCreated {
			t.Fatalf("retry: %d %s", rec.Code, rec.Body)
		}
		if st := r.state(t, o.OrderNo); !done(st) {
			t.Fatalf("after the retry: %+v", st)
		}
		if rec := r.post(o.OrderNo, "other"); rec.Code != http.StatusOK || decodeRefund(t, rec).Status != shop.StatusRefunded {
			t.Fatalf("another key after the refund: %d %s, want 200 and the refund", rec.Code, rec.Body)
		}
	})
}

// The provider refunds, then does not answer: the shop's call times out
// (the client's bound), 503; the retry gets the provider's stored answer
// under the same key, and the payment is refunded once.
func TestRefundProviderTimesOutAfterEffect(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		r := newRefundRig(t, b)
		o := r.paidOrder(t, "o1")
		if err := r.provider.SetFault(context.Background(), payprov.Fault{Path: "/v1/refunds", Mode: payprov.FaultTimeoutAfterEffect, Count: 1}); err != nil {
			t.Fatal(err)
		}
		rec := r.post(o.OrderNo, "r1")
		if rec.Code != http.StatusServiceUnavailable || problemCode(t, rec) != shop.CodeProviderUnavailable {
			t.Fatalf("refund whose answer is lost: %d %s", rec.Code, rec.Body)
		}
		if st := r.state(t, o.OrderNo); st.Order != shop.StatusRefunding || st.Ledger != 1 {
			t.Fatalf("after the lost answer: %+v, want REFUNDING and refunded at the provider", st)
		}
		if rec := r.post(o.OrderNo, "r1"); rec.Code != http.StatusCreated {
			t.Fatalf("retry: %d %s", rec.Code, rec.Body)
		}
		if st := r.state(t, o.OrderNo); !done(st) {
			t.Fatalf("after the retry: %+v", st)
		}
	})
}

// The provider refuses for good: 409 REFUND_REFUSED, stored (the retry
// gets the same bytes), the order PAID again with no refund row, nothing
// refunded, no event.
func TestRefundRefused(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		r := newRefundRig(t, b)
		o := r.paidOrder(t, "o1")
		// setPaid records no payment: the order's number is its reference.
		if err := r.provider.RegisterPayment(context.Background(), payprov.Payment{Payment: o.OrderNo, NonRefundable: true}); err != nil {
			t.Fatal(err)
		}
		first := r.post(o.OrderNo, "r1")
		if first.Code != http.StatusConflict || problemCode(t, first) != shop.CodeRefundRefused {
			t.Fatalf("refused refund: %d %s", first.Code, first.Body)
		}
		again := r.post(o.OrderNo, "r1")
		if again.Code != http.StatusConflict || !bytes.Equal(again.Body.Bytes(), first.Body.Bytes()) || again.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry: %d %s, want the refusal replayed", again.Code, again.Body)
		}
		if st := r.state(t, o.OrderNo); st.Order != shop.StatusPaid || st.Rows != 0 || st.Events != 0 || st.Ledger != 0 {
			t.Fatalf("after the refusal: %+v", st)
		}
	})
}

// A refund whose client gave up after a 503 is finished by the completer:
// the order REFUNDED, refunded once, one event; the client's later retry
// gets the answer the completer stored.
func TestRefundFinishedByCompleter(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		r := newRefundRig(t, b)
		o := r.paidOrder(t, "o1")
		ctx := context.Background()
		if err := r.provider.SetFault(ctx, payprov.Fault{Path: "/v1/refunds", Mode: payprov.FaultFail, Count: 1}); err != nil {
			t.Fatal(err)
		}
		if rec := r.post(o.OrderNo, "r1"); rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("refund: %d %s", rec.Code, rec.Body)
		}
		r.completeOne(t)
		st := r.state(t, o.OrderNo)
		if !done(st) {
			t.Fatalf("after the completer: %+v", st)
		}
		rec := r.post(o.OrderNo, "r1")
		if rec.Code != http.StatusCreated || rec.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("the client's retry: %d %s (replayed %q), want the stored 201", rec.Code, rec.Body, rec.Header().Get("Idempotent-Replayed"))
		}
		if ref := decodeRefund(t, rec); ref.ProviderRefundID != st.ProviderID || ref.Status != shop.StatusRefunded {
			t.Fatalf("the stored answer: %+v, state %+v", ref, st)
		}
		if p, err := r.s.Runner().Complete(ctx); err != nil || p.Due != 0 {
			t.Fatalf("a pass after: %+v, %v; want nothing due", p, err)
		}
		if st := r.state(t, o.OrderNo); !done(st) {
			t.Fatalf("at the end: %+v", st)
		}
	})
}

// An order free after its coupon is refunded without the provider (which
// refuses an amount of 0): REFUNDED, no provider id, one event.
func TestRefundOfAFreeOrder(t *testing.T) {
	c, _ := newProvider(t)
	db, _ := sqliteBackend.fresh(t)
	catalog := shop.Catalog{Products: []shop.Product{{SKU: "PIN-1", Name: "Pin", PriceCents: 100, Stock: 10}},
		Coupons: []shop.Coupon{{ID: 1, Name: "500 off", DiscountCents: 500, Total: 10}}}
	r := &refundRig{db: db, provider: c, s: shopOnWith(t, db, sqliteBackend.dialect, catalog, func(cfg *shop.Config) { cfg.Provider = c })}
	if status, _, code := claimCoupon(t, r.s, 5, "1"); status != http.StatusCreated {
		t.Fatalf("claim: %d %s", status, code)
	}
	_, o, _ := postOrder(t, r.s, 5, "o1", `{"sku":"PIN-1","quantity":1,"coupon_id":1}`)
	if o.AmountCents != 0 {
		t.Fatalf("order: %+v, want 0 cents", o)
	}
	setPaid(t, db, o.OrderNo)
	rec := r.post(o.OrderNo, "r1")
	if rec.Code != http.StatusCreated || decodeRefund(t, rec).ProviderRefundID != "" {
		t.Fatalf("refund: %d %s", rec.Code, rec.Body)
	}
	if st := r.state(t, o.OrderNo); st.Order != shop.StatusRefunded || st.Row != shop.StatusRefunded || st.Events != 1 || st.Ledger != 0 {
		t.Fatalf("after the refund: %+v", st)
	}
}
