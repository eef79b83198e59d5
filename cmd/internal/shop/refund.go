package shop

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/payprov"
	"github.com/idemkit/idem/steps"
)

// A refund is an operation of steps (package steps) named "refund", run
// under the request's idempotency record:
//
//	refunding  local    PAID → REFUNDING and the refund row (REFUNDING), in one transaction
//	provider   foreign  the payment provider's refund, under a key derived from the request's
//	refunded   local    the row REFUNDED with the provider's refund id, REFUNDING → REFUNDED
//	                    and the event order.refunded, in one transaction
//	refused    local    instead of refunded, when the provider refused: the row deleted
//	                    and REFUNDING → PAID, in one transaction
//
// A local step's transaction runs again, whole, when the database refused
// it as a deadlock victim or could not serialise it (retryable, as the
// shop's other transactions). Each step's result is checkpointed, so a
// retry of the request, or the completer after a crash or a failed
// attempt, resumes at the first step not done, and the provider
// de-duplicates its call by the derived key.
// The answer (201 and the refund; 200 for an order refunded already; 409
// REFUND_REFUSED) is stored in the record by the operation itself, so the
// completer stores the same bytes a client would have got.

// refundOpName is the refund operation's name in the steps journal.
const refundOpName = "refund"

// The refund operation's steps, by name (a step's name is its identity
// in the journal: never rename one that operations in flight may have).
const (
	StepRefunding = "refunding"
	StepProvider  = "provider"
	StepRefunded  = "refunded"
	StepRefused   = "refused"
	// StepProviderCall is no step of the journal: Config.AfterStep hears
	// it after the provider answered and before the provider step's
	// checkpoint, the moment a crash loses the answer.
	StepProviderCall = "provider-call"
)

// The local steps: their transaction runs again on a deadlock or a
// serialisation failure (retryable).
var (
	refundingStep = steps.Step[refundBegun]{Name: StepRefunding, Retry: retryable}
	refundedStep  = steps.Step[Refund]{Name: StepRefunded, Retry: retryable}
	refusedStep   = steps.Step[bool]{Name: StepRefused, Retry: retryable}
)

// Currency is the currency of the shop's amounts, as the payment
// provider is told it (refunds, charges).
const Currency = "USD"

// refundReason is what the shop tells the provider a refund is for.
const refundReason = "requested_by_customer"

// Statements of refunds, written with ? (rebind).
const (
	sqlInsertRefund = `INSERT INTO shop_refunds (refund_no, order_no, amount_cents, status, created_ms) VALUES (?, ?, ?, ?, ?)`
	sqlGetRefund    = `SELECT refund_no, order_no, amount_cents, status, provider_refund_id FROM shop_refunds WHERE order_no = ?`
	sqlRefundDone   = `UPDATE shop_refunds SET status = ?, provider_refund_id = ? WHERE order_no = ? AND status = ?`
	sqlRefundDrop   = `DELETE FROM shop_refunds WHERE order_no = ? AND status = ?`
	sqlOrderTradeNo = `SELECT trade_no FROM shop_payments WHERE order_no = ? ORDER BY id LIMIT 1`
)

// Provider is the payment provider, which also books shipments as a
// carrier would (*payprov.Client). Its errors are payprov.Client's: a
// *payprov.RefusedError is a definite refusal; any other leaves the
// outcome unknown, and the call is made again under the same key.
type Provider interface {
	Refund(ctx context.Context, key string, req payprov.RefundRequest) (payprov.Refund, error)
	Charge(ctx context.Context, key string, req payprov.ChargeRequest) (payprov.Charge, error)
	Ship(ctx context.Context, key string, req payprov.ShipmentRequest) (payprov.Shipment, error)
}

// Refund is a refund as the API shows it.
type Refund struct {
	RefundNo    string `json:"refund_no"`
	OrderNo     string `json:"order_no"`
	AmountCents int64  `json:"amount_cents"`
	Status      string `json:"status"`
	// ProviderRefundID is the payment provider's id of the refund (re_…);
	// empty for a refund made before refunds went through the provider.
	ProviderRefundID string `json:"provider_refund_id,omitempty"`
}

// newRefundNo returns a random refund number, e.g. "ref_3f9c0a5e1b2d4c6f8a7e9b10".
func newRefundNo() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "ref_" + hex.EncodeToString(b[:])
}

// refundInput is the refund operation's input, kept in the journal for
// the completer.
type refundInput struct {
	User    int64  `json:"user"`
	OrderNo string `json:"order_no"`
}

// refundAnswer is the refund operation's result.
type refundAnswer struct {
	Refund Refund `json:"refund"`
	// Created: this operation refunded the order (201); false: it was
	// refunded already, by another request (200).
	Created bool `json:"created"`
}

// refundBegun is the refunding step's checkpoint.
type refundBegun struct {
	Refund Refund `json:"refund"`
	// Payment is the provider's id of the order's payment.
	Payment string `json:"payment"`
	// Existing: the order was refunded already; Refund is that refund,
	// and no other step runs.
	Existing bool `json:"existing,omitempty"`
}

// problemRefundInProgress: another request's refund of the order runs.
// Not stored (a retry later gets the refund).
func problemRefundInProgress(orderNo string) *problemError {
	return &problemError{http.StatusConflict, CodeRefundInProgress, "Refund in progress",
		fmt.Sprintf("order %s is being refunded by another request; retry later to get the refund", orderNo)}
}

func problemNotRefundable(orderNo, status string) *problemError {
	return &problemError{http.StatusConflict, CodeOrderNotRefundable, "Order not refundable",
		fmt.Sprintf("order %s is %s; only a paid order (PAID) can be refunded", orderNo, status)}
}

// defineRefund defines the refund operation on r.
func (s *Shop) defineRefund(r *steps.Runner) (*steps.Op[refundInput, refundAnswer], error) {
	return steps.Define(r, refundOpName, s.refundSteps, &steps.OpConfig[refundInput, refundAnswer]{
		Encode: encodeRefund,
		Decode: decodeRefund,
	})
}

// afterStep tells Config.AfterStep that step is done.
func (s *Shop) afterStep(step string) {
	if s.stepHook != nil {
		s.stepHook(step)
	}
}

// refundSteps is the refund operation.
func (s *Shop) refundSteps(ctx context.Context, run *steps.Run, in refundInput) (refundAnswer, error) {
	begun, err := refundingStep.Local(run, func(ctx context.Context, tx *sql.Tx) (refundBegun, error) {
		return s.beginRefund(ctx, tx, in)
	})
	if err != nil {
		return refundAnswer{}, err
	}
	s.afterStep(StepRefunding)
	if begun.Existing {
		return refundAnswer{Refund: begun.Refund}, nil
	}
	ref := begun.Refund
	if ref.AmountCents == 0 {
		// An order free after its coupon: nothing to refund at the
		// provider (which refuses an amount of 0).
		return s.refunded(run, ref, providerCall{})
	}
	paid, err := steps.Foreign(run, StepProvider, func(ctx context.Context, key string) (providerCall, error) {
		return callProvider(func() (providerCall, error) {
			got, err := s.provider.Refund(ctx, key, payprov.RefundRequest{
				Payment: begun.Payment, AmountCents: ref.AmountCents, Currency: Currency, Reason: refundReason,
			})
			s.afterStep(StepProviderCall)
			return providerCall{ID: got.ID}, err
		})
	})
	if err != nil {
		return refundAnswer{}, err
	}
	s.afterStep(StepProvider)
	if paid.Refused != "" {
		if _, err := refusedStep.Local(run, func(ctx context.Context, tx *sql.Tx) (bool, error) {
			return true, s.undoRefund(ctx, tx, ref.OrderNo)
		}); err != nil {
			return refundAnswer{}, err
		}
		s.afterStep(StepRefused)
		return refundAnswer{}, &idem.DefiniteError{Code: CodeRefundRefused,
			Message: fmt.Sprintf("the payment provider refused to refund order %s (%s: %s); the order is PAID again", ref.OrderNo, paid.Refused, paid.Message)}
	}
	return s.refunded(run, ref, paid)
}

// refunded runs the refunded step: ref done, with the provider's refund
// paid (none for an amount of 0).
func (s *Shop) refunded(run *steps.Run, ref Refund, paid providerCall) (refundAnswer, error) {
	done, err := refundedStep.Local(run, func(ctx context.Context, tx *sql.Tx) (Refund, error) {
		return s.finishRefund(ctx, tx, ref, paid.ID)
	})
	if err != nil {
		return refundAnswer{}, err
	}
	s.afterStep(StepRefunded)
	return refundAnswer{Refund: done, Created: true}, nil
}

// beginRefund is the refunding step: user's order in.OrderNo, PAID, moves
// to REFUNDING with the version it read, and its refund row is inserted
// (REFUNDING), unique on the order. An order refunded already answers its
// refund (Existing). Refusals are *problemError: NOT_FOUND,
// ORDER_NOT_REFUNDABLE (not paid), REFUND_IN_PROGRESS (another request
// refunds it).
func (s *Shop) beginRefund(ctx context.Context, tx *sql.Tx, in refundInput) (refundBegun, error) {
	o, other, err := s.holdOrder(ctx, tx, in.User, in.OrderNo, trRefund)
	switch {
	case err != nil:
		return refundBegun{}, err
	case other != "":
		return s.notBegun(ctx, tx, in.OrderNo, other)
	}
	var payment string
	switch err := tx.QueryRowContext(ctx, rebind(s.dialect, sqlOrderTradeNo), in.OrderNo).Scan(&payment); {
	case errors.Is(err, sql.ErrNoRows):
		// Paid with no payment on record (an order paid by hand): the
		// order's number is the payment's reference.
		payment = in.OrderNo
	case err != nil:
		return refundBegun{}, fmt.Errorf("read the order's payment: %w", err)
	}
	ref := Refund{RefundNo: newRefundNo(), OrderNo: in.OrderNo, AmountCents: o.AmountCents, Status: StatusRefunding}
	if _, err := tx.ExecContext(ctx, rebind(s.dialect, sqlInsertRefund), ref.RefundNo, ref.OrderNo, ref.AmountCents, ref.Status, time.Now().UnixMilli()); err != nil {
		return refundBegun{}, fmt.Errorf("insert the refund row: %w", err)
	}
	return refundBegun{Refund: ref, Payment: payment}, nil
}

// notBegun answers a refund of an order in status, which is not PAID.
func (s *Shop) notBegun(ctx context.Context, tx *sql.Tx, orderNo, status string) (refundBegun, error) {
	switch status {
	case StatusRefunded:
		ref, err := s.readRefund(ctx, tx, orderNo)
		if err != nil {
			return refundBegun{}, err
		}
		return refundBegun{Refund: ref, Existing: true}, nil
	case StatusRefunding:
		return refundBegun{}, problemRefundInProgress(orderNo)
	}
	return refundBegun{}, problemNotRefundable(orderNo, status)
}

// readRefund reads order orderNo's refund row.
func (s *Shop) readRefund(ctx context.Context, q querier, orderNo string) (Refund, error) {
	var ref Refund
	var provider sql.NullString
	err := q.QueryRowContext(ctx, rebind(s.dialect, sqlGetRefund), orderNo).Scan(&ref.RefundNo, &ref.OrderNo, &ref.AmountCents, &ref.Status, &provider)
	if err != nil {
		return Refund{}, fmt.Errorf("read the refund row of order %s: %w", orderNo, err)
	}
	ref.ProviderRefundID = provider.String
	return ref, nil
}

// finishRefund is the refunded step: ref's row becomes REFUNDED with the
// provider's refund id (NULL when there is none: an amount of 0), the
// order REFUNDING → REFUNDED, and the event order.refunded is written, in
// tx.
func (s *Shop) finishRefund(ctx context.Context, tx *sql.Tx, ref Refund, providerID string) (Refund, error) {
	res, err := tx.ExecContext(ctx, rebind(s.dialect, sqlRefundDone), StatusRefunded, sql.NullString{String: providerID, Valid: providerID != ""}, ref.OrderNo, StatusRefunding)
	if err != nil {
		return Refund{}, fmt.Errorf("mark the refund row refunded: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return Refund{}, fmt.Errorf("mark the refund row refunded: %w", err)
	} else if n != 1 {
		return Refund{}, fmt.Errorf("shop: order %s has no REFUNDING refund row to mark refunded", ref.OrderNo)
	}
	if err := s.leaveHeld(ctx, tx, ref.OrderNo, trRefunded); err != nil {
		return Refund{}, err
	}
	if err := s.addEvent(ctx, tx, EventOrderRefunded, ref.OrderNo); err != nil {
		return Refund{}, err
	}
	ref.Status, ref.ProviderRefundID = StatusRefunded, providerID
	return ref, nil
}

// undoRefund is the refused step: the order's REFUNDING refund row is
// deleted (the idempotency record keeps the refusal; a new request may
// try again) and the order moves REFUNDING → PAID, in tx.
func (s *Shop) undoRefund(ctx context.Context, tx *sql.Tx, orderNo string) error {
	if _, err := tx.ExecContext(ctx, rebind(s.dialect, sqlRefundDrop), orderNo, StatusRefunding); err != nil {
		return fmt.Errorf("delete the refused refund row: %w", err)
	}
	return s.leaveHeld(ctx, tx, orderNo, trRefused)
}

// encodeRefund is the refund operation's OpConfig.Encode: 201 and the
// Refund (200 for an order refunded already), or encodeOp's answer to
// an error.
func encodeRefund(out refundAnswer, err error) (idem.Response, error, bool) {
	status := http.StatusOK
	if out.Created {
		status = http.StatusCreated
	}
	return encodeOp(status, out.Refund, err)
}

// decodeRefund is the refund operation's OpConfig.Decode.
func decodeRefund(resp idem.Response, replayed bool) (refundAnswer, error) {
	var out refundAnswer
	out.Created = resp.StatusCode == http.StatusCreated
	err := decodeOp(resp, replayed, &out.Refund)
	return out, err
}

// refundHandler serves POST /orders/{order_no}/refunds: it runs the
// refund operation inside the request's execution. The operation stores
// its answer in the record itself; the middleware sends that.
func (s *Shop) refundHandler(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	out, err := s.refund.Run(ctx, refundInput{User: userFrom(ctx), OrderNo: r.PathValue("order_no")})
	resp, _, stored := encodeRefund(out, err)
	s.answerOp(w, r, "refund order", resp, stored, err)
}
