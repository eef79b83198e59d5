package shop_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemkit/idem/cmd/internal/payprov"
	"github.com/idemkit/idem/cmd/internal/shop"
)

// checkout sends POST /orders/{orderNo}/card-checkout as user 5 with key
// and the card source.
func (r *refundRig) checkout(orderNo, key, source string) *httptest.ResponseRecorder {
	body := `{"source":"` + source + `","address":"1 Main Street, Springfield"}`
	return serve(r.s, "POST", "/orders/"+orderNo+"/card-checkout", map[string]string{"X-User-ID": "5", "Idempotency-Key": key, "Content-Type": "application/json"}, body)
}

// checkoutState is what the shop and the provider hold of a checkout.
type checkoutState struct {
	Order                    string
	Payments, Shipments      int // rows
	PaidEvents               int
	Charges, ShipmentsBooked int // at the provider
}

func (r *refundRig) checkoutState(t *testing.T, orderNo string) checkoutState {
	t.Helper()
	var st checkoutState
	if err := r.db.QueryRow(`SELECT status FROM shop_orders WHERE order_no = '` + orderNo + `'`).Scan(&st.Order); err != nil {
		t.Fatal(err)
	}
	st.Payments = countRows(t, r.db, `SELECT COUNT(*) FROM shop_payments WHERE order_no = '`+orderNo+`'`)
	st.Shipments = countRows(t, r.db, `SELECT COUNT(*) FROM shop_shipments WHERE order_no = '`+orderNo+`'`)
	st.PaidEvents = countRows(t, r.db, `SELECT COUNT(*) FROM idem_outbox WHERE topic = 'order.paid' AND msg_key = '`+orderNo+`'`)
	for kind, n := range map[payprov.Kind]*int{payprov.KindCharge: &st.Charges, payprov.KindShipment: &st.ShipmentsBooked} {
		l, err := r.provider.Ledger(context.Background(), kind)
		if err != nil {
			t.Fatal(err)
		}
		*n = len(l.Effects)
	}
	return st
}

// checkedOut is the state of an order charged and shipped once.
var checkedOut = checkoutState{Order: shop.StatusPaid, Payments: 1, Shipments: 1, PaidEvents: 1, Charges: 1, ShipmentsBooked: 1}

// A card checkout charges once and ships once: 201 with the charge and
// the shipment, replayed to the retry; the order PAID with its payment
// row (the charge), its shipment row and order.paid. A refund of it then
// refunds the charge.
func TestCardCheckout(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		r := newRefundRig(t, b)
		_, o, _ := postOrder(t, r.s, 5, "o1", `{"sku":"SKU-1","quantity":2}`)
		first := r.checkout(o.OrderNo, "c1", "tok_visa")
		if first.Code != http.StatusCreated {
			t.Fatalf("checkout: %d %s", first.Code, first.Body)
		}
		var co shop.CardCheckout
		if err := json.Unmarshal(first.Body.Bytes(), &co); err != nil {
			t.Fatal(err)
		}
		if co.Status != shop.StatusPaid || co.AmountCents != 2*1299 || co.ChargeID == "" || co.ShipmentID == "" || co.TrackingNumber == "" {
			t.Fatalf("checkout: %+v", co)
		}
		again := r.checkout(o.OrderNo, "c1", "tok_visa")
		if again.Code != http.StatusCreated || !bytes.Equal(again.Body.Bytes(), first.Body.Bytes()) || again.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry: %d %s", again.Code, again.Body)
		}
		if st := r.checkoutState(t, o.OrderNo); st != checkedOut {
			t.Fatalf("after the checkout: %+v, want %+v", st, checkedOut)
		}
		if rec := r.checkout(o.OrderNo, "c2", "tok_visa"); rec.Code != http.StatusConflict || problemCode(t, rec) != shop.CodeOrderNotPayable {
			t.Fatalf("another checkout of the paid order: %d %s", rec.Code, rec.Body)
		}
		if rec := r.post(o.OrderNo, "r1"); rec.Code != http.StatusCreated {
			t.Fatalf("refund: %d %s", rec.Code, rec.Body)
		}
		if n := ledgerRefunds(t, r.provider, co.ChargeID); n != 1 {
			t.Fatalf("%d refunds of the charge %s, want 1", n, co.ChargeID)
		}
	})
}

// A declined card: 402 CARD_DECLINED, stored; the order waits for its
// payment again, nothing charged, shipped or written.
func TestCardCheckoutDeclined(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		r := newRefundRig(t, b)
		_, o, _ := postOrder(t, r.s, 5, "o1", `{"sku":"SKU-1","quantity":1}`)
		first := r.checkout(o.OrderNo, "c1", payprov.DeclinedSource)
		if first.Code != http.StatusPaymentRequired || problemCode(t, first) != shop.CodeCardDeclined {
			t.Fatalf("declined checkout: %d %s", first.Code, first.Body)
		}
		if again := r.checkout(o.OrderNo, "c1", payprov.DeclinedSource); !bytes.Equal(again.Body.Bytes(), first.Body.Bytes()) || again.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry: %d %s", again.Code, again.Body)
		}
		if st := r.checkoutState(t, o.OrderNo); st != (checkoutState{Order: shop.StatusWaitPay}) {
			t.Fatalf("after the decline: %+v", st)
		}
		if rec := r.checkout(o.OrderNo, "c2", "tok_visa"); rec.Code != http.StatusCreated {
			t.Fatalf("checkout with another card: %d %s", rec.Code, rec.Body)
		}
	})
}

// The carrier fails after the card was charged: 503, the order PAID; the
// retry, or the completer when nobody retries, resumes at the shipment:
// the card is charged once.
func TestCardCheckoutShipmentFails(t *testing.T) {
	for _, finisher := range []string{"retry", "completer"} {
		t.Run(finisher, func(t *testing.T) {
			forBackends(t, func(t *testing.T, b backend) {
				r := newRefundRig(t, b)
				ctx := context.Background()
				_, o, _ := postOrder(t, r.s, 5, "o1", `{"sku":"SKU-1","quantity":1}`)
				if err := r.provider.SetFault(ctx, payprov.Fault{Path: "/v1/shipments", Mode: payprov.FaultFail, Count: 1}); err != nil {
					t.Fatal(err)
				}
				rec := r.checkout(o.OrderNo, "c1", "tok_visa")
				if rec.Code != http.StatusServiceUnavailable || problemCode(t, rec) != shop.CodeProviderUnavailable {
					t.Fatalf("checkout while the carrier fails: %d %s", rec.Code, rec.Body)
				}
				if st := r.checkoutState(t, o.OrderNo); st != (checkoutState{Order: shop.StatusPaid, Payments: 1, PaidEvents: 1, Charges: 1}) {
					t.Fatalf("after the failure: %+v", st)
				}
				if finisher == "completer" {
					r.completeOne(t)
					if st := r.checkoutState(t, o.OrderNo); st != checkedOut {
						t.Fatalf("after the completer: %+v, want %+v", st, checkedOut)
					}
				}
				rec = r.checkout(o.OrderNo, "c1", "tok_visa")
				if rec.Code != http.StatusCreated {
					t.Fatalf("retry: %d %s", rec.Code, rec.Body)
				}
				if replayed := rec.Header().Get("Idempotent-Replayed") == "true"; replayed != (finisher == "completer") {
					t.Fatalf("retry replayed %v after the %s", replayed, finisher)
				}
				if st := r.checkoutState(t, o.OrderNo); st != checkedOut {
					t.Fatalf("at the end: %+v, want %+v", st, checkedOut)
				}
			})
		})
	}
}

// A body that is not {"source", "address"} is 400, and nothing runs.
func TestCardCheckoutBadBody(t *testing.T) {
	r := newRefundRig(t, sqliteBackend)
	_, o, _ := postOrder(t, r.s, 5, "o1", `{"sku":"SKU-1","quantity":1}`)
	for _, body := range []string{``, `{}`, `{"source":"tok_visa"}`, `{"source":"","address":"x"}`, `{"source":"tok_visa","address":"a\u0000b"}`, `{"Source":"tok_visa","address":"x"}`} {
		rec := serve(r.s, "POST", "/orders/"+o.OrderNo+"/card-checkout", map[string]string{"X-User-ID": "5", "Idempotency-Key": "k" + body, "Content-Type": "application/json"}, body)
		if rec.Code != http.StatusBadRequest || problemCode(t, rec) != "INVALID_REQUEST" {
			t.Errorf("body %q: %d %s", body, rec.Code, rec.Body)
		}
	}
	if st := r.checkoutState(t, o.OrderNo); st != (checkoutState{Order: shop.StatusWaitPay}) {
		t.Fatalf("after bad bodies: %+v", st)
	}
}
