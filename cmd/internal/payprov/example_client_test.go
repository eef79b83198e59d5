package payprov_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/idemkit/idem/cmd/internal/payprov"
)

// A refund whose answer is lost after the provider made it, retried under
// the same key: the provider refunds once and answers the retry with the
// first refund. A second refund of the payment is refused for good.
func ExampleClient() {
	srv, err := payprov.New(nil)
	if err != nil {
		panic(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	defer srv.Close()
	c := &payprov.Client{BaseURL: ts.URL}
	ctx := context.Background()

	c.RegisterPayment(ctx, payprov.Payment{Payment: "pay_42", AmountCents: 1299})
	c.SetFault(ctx, payprov.Fault{Path: "/v1/refunds", Mode: payprov.FaultTimeoutAfterEffect, Count: 1})
	req := payprov.RefundRequest{Payment: "pay_42", AmountCents: 1299, Currency: "EUR"}

	// The caller gives up on its first attempt once the refund is made
	// (a timeout, in real life).
	attempt, cancel := context.WithCancel(ctx)
	go func() {
		defer cancel()
		for {
			if l, err := c.Ledger(ctx, payprov.KindRefund); err != nil || len(l.Effects) > 0 {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	_, err = c.Refund(attempt, "order-42-refund", req)
	fmt.Println("first attempt:", err != nil, "retryable:", payprov.Retryable(err))

	r, err := c.Refund(ctx, "order-42-refund", req)
	fmt.Println("retry:", r.Status, r.AmountCents, err)

	_, err = c.Refund(ctx, "order-42-refund-again", req)
	var refused *payprov.RefusedError
	fmt.Println("another key:", errors.As(err, &refused), refused.Code)

	l, _ := c.Ledger(ctx, payprov.KindRefund)
	fmt.Println("refunds made:", len(l.Effects), l.Effects[0].ID == r.ID)
	// Output:
	// first attempt: true retryable: true
	// retry: succeeded 1299 <nil>
	// another key: true refund_refused
	// refunds made: 1 true
}
