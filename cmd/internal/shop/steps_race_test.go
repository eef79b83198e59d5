package shop_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/idemkit/idem/cmd/internal/payprov"
	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/idemhttp"
)

// race runs n requests at once (released together) and returns their
// answers, request i made by do(i).
func race(n int, do func(i int) *httptest.ResponseRecorder) []*httptest.ResponseRecorder {
	out := make([]*httptest.ResponseRecorder, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out[i] = do(i)
		}()
	}
	close(start)
	wg.Wait()
	return out
}

// settle sends do again while it answers "come back later" (409
// PROCESSING or an operation in progress, 503), each time after the
// completer's pass; it returns the first other answer.
func (r *refundRig) settle(t *testing.T, do func() *httptest.ResponseRecorder) *httptest.ResponseRecorder {
	t.Helper()
	for range 200 {
		rec := do()
		code := ""
		if rec.Code >= 400 {
			code = problemCode(t, rec)
		}
		switch {
		case rec.Code == http.StatusServiceUnavailable, code == idemhttp.CodeProcessing,
			code == shop.CodeRefundInProgress, code == shop.CodeCheckoutInProgress:
			if _, err := r.s.Runner().Complete(context.Background()); err != nil {
				t.Fatal(err)
			}
			continue
		}
		return rec
	}
	t.Fatal("still in progress after 200 tries")
	return nil
}

// Many checkouts and refunds of one order at once, under one key and
// under keys of their own, while the provider answers slowly and a
// cancel races them: the card is charged once, shipped once, refunded
// once; the order's rows and events match the provider's ledger; every
// key's final answer is the effect or a refusal, never a second effect.
func TestStepsConcurrentDuplicates(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		r := newRefundRig(t, b)
		ctx := context.Background()
		_, o, _ := postOrder(t, r.s, 5, "o1", `{"sku":"SKU-1","quantity":1}`)
		if err := r.provider.SetFault(ctx, payprov.Fault{Path: "/v1/charges", Mode: payprov.FaultDelay, Count: 4, DelayMS: 50}); err != nil {
			t.Fatal(err)
		}
		const n = 12
		key := func(i int) string {
			if i%2 == 0 {
				return "c-same"
			}
			return "c-" + strconv.Itoa(i)
		}
		race(n+1, func(i int) *httptest.ResponseRecorder {
			if i == n {
				return serve(r.s, "POST", "/orders/"+o.OrderNo+"/cancel", map[string]string{"X-User-ID": "5"}, "")
			}
			return r.checkout(o.OrderNo, key(i), "tok_visa")
		})
		created := 0
		for i := range n {
			rec := r.settle(t, func() *httptest.ResponseRecorder { return r.checkout(o.OrderNo, key(i), "tok_visa") })
			switch {
			case rec.Code == http.StatusCreated:
				created++
			case rec.Code == http.StatusConflict && problemCode(t, rec) == shop.CodeOrderNotPayable:
			default:
				t.Fatalf("checkout %s at the end: %d %s", key(i), rec.Code, rec.Body)
			}
		}
		st := r.checkoutState(t, o.OrderNo)
		switch st.Order {
		case shop.StatusCancelled:
			if st != (checkoutState{Order: shop.StatusCancelled}) || created != 0 {
				t.Fatalf("cancelled, with %+v and %d checkouts created", st, created)
			}
			return
		case shop.StatusPaid:
			if st != checkedOut || created == 0 {
				t.Fatalf("paid: %+v and %d checkouts created, want %+v", st, created, checkedOut)
			}
		default:
			t.Fatalf("order at the end: %+v", st)
		}

		if err := r.provider.SetFault(ctx, payprov.Fault{Path: "/v1/refunds", Mode: payprov.FaultDelay, Count: 4, DelayMS: 50}); err != nil {
			t.Fatal(err)
		}
		rkey := func(i int) string {
			if i%2 == 0 {
				return "r-same"
			}
			return "r-" + strconv.Itoa(i)
		}
		race(n, func(i int) *httptest.ResponseRecorder { return r.post(o.OrderNo, rkey(i)) })
		var refundNo string
		for i := range n {
			rec := r.settle(t, func() *httptest.ResponseRecorder { return r.post(o.OrderNo, rkey(i)) })
			if rec.Code != http.StatusCreated && rec.Code != http.StatusOK {
				t.Fatalf("refund %s at the end: %d %s", rkey(i), rec.Code, rec.Body)
			}
			ref := decodeRefund(t, rec)
			if refundNo == "" {
				refundNo = ref.RefundNo
			}
			if ref.RefundNo != refundNo || ref.Status != shop.StatusRefunded {
				t.Fatalf("refund %s: %+v, want refund %s REFUNDED", rkey(i), ref, refundNo)
			}
		}
		l, err := r.provider.Ledger(ctx, payprov.KindCharge)
		if err != nil {
			t.Fatal(err)
		}
		if n := ledgerRefunds(t, r.provider, l.Effects[0].ID); n != 1 {
			t.Fatalf("%d refunds of the charge, want 1", n)
		}
		if st := r.state(t, o.OrderNo); st.Order != shop.StatusRefunded || st.Rows != 1 || st.Events != 1 || st.ProviderID == "" {
			t.Fatalf("after the refunds: %+v", st)
		}
	})
}
