package shop_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/idemkit/idem/cmd/internal/payprov"
	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/steps"
)

// A refund's attempt fails after its first step (503: the order
// REFUNDING, the key released), and the client sends the same
// Idempotency-Key with another request: the refund of another order.
// The half-done refund must not be replaced by it: that dropped its
// checkpoints and its journal entry, so nothing ever finished it (the
// order REFUNDING for good, refunded at the provider when its answer
// was lost, with no operation for an operator to see), and the other
// refund called the provider under the first one's derived key (422
// there: REFUNDING for good too). The reuse is refused (422
// KEY_MISMATCH, not stored); the first refund is finished by the
// completer, the other order refunds under a key of its own.
func TestRefundKeyReusedAfterFailedAttempt(t *testing.T) {
	for _, mode := range []payprov.FaultMode{payprov.FaultFail, payprov.FaultTimeoutAfterEffect} {
		t.Run(string(mode), func(t *testing.T) {
			forBackends(t, func(t *testing.T, b backend) {
				r := newRefundRig(t, b)
				ctx := context.Background()
				a, other := r.paidOrder(t, "o1"), r.paidOrder(t, "o2")
				if err := r.provider.SetFault(ctx, payprov.Fault{Path: "/v1/refunds", Mode: mode, Count: 1}); err != nil {
					t.Fatal(err)
				}
				if rec := r.post(a.OrderNo, "k1"); rec.Code != http.StatusServiceUnavailable {
					t.Fatalf("refund of a: %d %s", rec.Code, rec.Body)
				}
				rec := r.post(other.OrderNo, "k1")
				if rec.Code != http.StatusUnprocessableEntity || problemCode(t, rec) != idemhttp.CodeKeyMismatch {
					t.Errorf("refund of another order under the key: %d %s, want 422 %s", rec.Code, rec.Body, idemhttp.CodeKeyMismatch)
				}
				if st := r.state(t, other.OrderNo); st != (refundState{Order: shop.StatusPaid}) {
					t.Errorf("the other order after the reuse: %+v", st)
				}
				op, err := r.s.Runner().Journal().Get(ctx, "user:5", "k1")
				if err != nil || op.Name != "refund" || op.State != steps.StateWaiting || len(op.Checkpoints) == 0 {
					t.Fatalf("the refund of a in the journal: %+v, %v; want waiting, with its checkpoints", op, err)
				}
				r.completeOne(t)
				if st := r.state(t, a.OrderNo); !done(st) {
					t.Fatalf("a after the completer: %+v", st)
				}
				if rec := r.post(other.OrderNo, "k2"); rec.Code != http.StatusCreated {
					t.Fatalf("refund of the other order under a key of its own: %d %s", rec.Code, rec.Body)
				}
				if st := r.state(t, other.OrderNo); !done(st) {
					t.Fatalf("the other order at the end: %+v", st)
				}
			})
		})
	}
}
