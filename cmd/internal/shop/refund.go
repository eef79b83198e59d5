package shop

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/payprov"
	"github.com/idemkit/idem/idemhttp"
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
// retry of the request, or the
// completer after a crash or a failed attempt, resumes at the first step
// not done, and the provider de-duplicates its call by the derived key.
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

// RefundCurrency is the currency of the shop's amounts, as the provider
// is told it.
const RefundCurrency = "USD"

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

// Refunder refunds payments at the payment provider (*payprov.Client).
// Its errors are payprov.Client.Refund's: a *payprov.RefusedError is a
// definite refusal; any other leaves the outcome unknown, and the call
// is made again under the same key.
type Refunder interface {
	Refund(ctx context.Context, key string, req payprov.RefundRequest) (payprov.Refund, error)
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

// providerAnswer is the provider step's checkpoint: the provider's
// refund, or its definite refusal (kept, so that a resumed run does not
// ask again).
type providerAnswer struct {
	ID      string `json:"id,omitempty"`
	Refused string `json:"refused,omitempty"`
	Message string `json:"message,omitempty"`
}

// errProviderUnavailable marks a provider call whose outcome is unknown
// (a failure, a timeout): the attempt ends, 503 PROVIDER_UNAVAILABLE.
var errProviderUnavailable = errors.New("shop: the payment provider did not answer the refund")

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
	paid, err := steps.Foreign(run, StepProvider, func(ctx context.Context, key string) (providerAnswer, error) {
		got, err := s.provider.Refund(ctx, key, payprov.RefundRequest{
			Payment: begun.Payment, AmountCents: ref.AmountCents, Currency: RefundCurrency, Reason: refundReason,
		})
		s.afterStep(StepProviderCall)
		var refused *payprov.RefusedError
		switch {
		case errors.As(err, &refused):
			return providerAnswer{Refused: refused.Code, Message: refused.Message}, nil
		case err != nil:
			return providerAnswer{}, fmt.Errorf("%w: %w", errProviderUnavailable, err)
		}
		return providerAnswer{ID: got.ID}, nil
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
	for {
		o, err := s.orderOf(ctx, tx, in.User, in.OrderNo)
		if errors.Is(err, errOrderNotFound) {
			return refundBegun{}, problemOrderNotFound
		} else if err != nil {
			return refundBegun{}, err
		}
		if o.Status != StatusPaid {
			return s.notBegun(ctx, tx, in.OrderNo, o.Status)
		}
		var payment string
		switch err := tx.QueryRowContext(ctx, rebind(s.dialect, sqlOrderTradeNo), in.OrderNo).Scan(&payment); {
		case errors.Is(err, sql.ErrNoRows):
			// Paid with no payment on record (an order paid by hand):
			// the order's number is the payment's reference.
			payment = in.OrderNo
		case err != nil:
			return refundBegun{}, fmt.Errorf("read the order's payment: %w", err)
		}
		t, err := s.transitionOrder(ctx, tx, in.OrderNo, trRefund, o.Version)
		var illegal *illegalTransitionError
		var conflict *conflictError
		switch {
		case errors.As(err, &conflict):
			continue // read it again
		case errors.As(err, &illegal):
			return s.notBegun(ctx, tx, in.OrderNo, illegal.Current)
		case err != nil:
			return refundBegun{}, err
		case t.AlreadyApplied:
			return s.notBegun(ctx, tx, in.OrderNo, StatusRefunding)
		}
		ref := Refund{RefundNo: newRefundNo(), OrderNo: in.OrderNo, AmountCents: o.AmountCents, Status: StatusRefunding}
		if _, err := tx.ExecContext(ctx, rebind(s.dialect, sqlInsertRefund), ref.RefundNo, ref.OrderNo, ref.AmountCents, ref.Status, time.Now().UnixMilli()); err != nil {
			return refundBegun{}, fmt.Errorf("insert the refund row: %w", err)
		}
		return refundBegun{Refund: ref, Payment: payment}, nil
	}
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
// provider's refund id, the order REFUNDING → REFUNDED, and the event
// order.refunded is written, in tx.
func (s *Shop) finishRefund(ctx context.Context, tx *sql.Tx, ref Refund, providerID string) (Refund, error) {
	res, err := tx.ExecContext(ctx, rebind(s.dialect, sqlRefundDone), StatusRefunded, providerID, ref.OrderNo, StatusRefunding)
	if err != nil {
		return Refund{}, fmt.Errorf("mark the refund row refunded: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return Refund{}, fmt.Errorf("mark the refund row refunded: %w", err)
	} else if n != 1 {
		return Refund{}, fmt.Errorf("shop: order %s has no REFUNDING refund row to mark refunded", ref.OrderNo)
	}
	if err := s.leaveRefunding(ctx, tx, ref.OrderNo, trRefunded); err != nil {
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
	return s.leaveRefunding(ctx, tx, orderNo, trRefused)
}

// leaveRefunding makes transition name (refunded, refused) of orderNo,
// which this operation moved to REFUNDING: nothing else moves it from
// there, so any other outcome is a failure.
func (s *Shop) leaveRefunding(ctx context.Context, tx *sql.Tx, orderNo, name string) error {
	t, err := s.transitionOrder(ctx, tx, orderNo, name, 0)
	switch {
	case err != nil:
		return err
	case t.AlreadyApplied:
		return fmt.Errorf("shop: order %s left REFUNDING without its refund operation (transition %s)", orderNo, name)
	}
	return nil
}

// encodeRefund is the refund operation's OpConfig.Encode: the record
// holds the HTTP answer. A refund: 201 (200 for an order refunded
// already) and the Refund. A definite refusal of the provider: 409
// REFUND_REFUSED. A refusal of the request (*problemError, but
// REFUND_IN_PROGRESS): its problem. Anything else is not stored (the
// attempt failed; the key is released).
func encodeRefund(out refundAnswer, err error) (idem.Response, error, bool) {
	var de *idem.DefiniteError
	var pe *problemError
	switch {
	case err == nil:
		status := http.StatusOK
		if out.Created {
			status = http.StatusCreated
		}
		resp, jerr := idemhttp.JSONResponse(status, out.Refund)
		if jerr != nil {
			return idem.Response{}, jerr, false
		}
		return resp, nil, true
	case errors.As(err, &de) && de.Code == CodeRefundRefused:
		return problemResponse(http.StatusConflict, CodeRefundRefused, "Refund refused", de.Message), err, true
	case errors.As(err, &pe) && pe.code != CodeRefundInProgress:
		return problemResponse(pe.status, pe.code, pe.title, pe.detail), err, true
	}
	return idem.Response{}, err, false
}

// decodeRefund is the refund operation's OpConfig.Decode: a stored
// answer back into the operation's result or error.
func decodeRefund(resp idem.Response, replayed bool) (refundAnswer, error) {
	if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusCreated {
		var out refundAnswer
		out.Created = resp.StatusCode == http.StatusCreated
		if err := json.Unmarshal(resp.Body, &out.Refund); err != nil {
			return refundAnswer{}, fmt.Errorf("shop: decode a stored refund: %w", err)
		}
		return out, nil
	}
	var p problem
	if err := json.Unmarshal(resp.Body, &p); err != nil {
		return refundAnswer{}, fmt.Errorf("shop: decode a stored refund's problem (status %d): %w", resp.StatusCode, err)
	}
	if p.Code == CodeRefundRefused {
		return refundAnswer{}, &idem.DefiniteError{Code: p.Code, Message: p.Detail, Replayed: replayed}
	}
	return refundAnswer{}, &problemError{resp.StatusCode, p.Code, p.Title, p.Detail}
}

// refundHandler serves POST /orders/{order_no}/refunds: it runs the
// refund operation inside the request's execution. The operation stores
// its answer in the record itself; the middleware sends that.
func (s *Shop) refundHandler(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	out, err := s.refund.Run(ctx, refundInput{User: userFrom(ctx), OrderNo: r.PathValue("order_no")})
	var pe *problemError
	switch resp, _, stored := encodeRefund(out, err); {
	case errors.Is(err, idem.ErrLeaseLost):
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusConflict, idemhttp.CodeProcessing, "Request in progress",
			"another execution of this request took over; retry to get its answer")
	case stored:
		idemhttp.WriteResponse(w, resp)
	case errors.As(err, &pe):
		// REFUND_IN_PROGRESS: Retry-After makes idemhttp release the key.
		w.Header().Set("Retry-After", "1")
		writeProblem(w, pe.status, pe.code, pe.title, pe.detail)
	case errors.Is(err, errProviderUnavailable):
		s.log.WarnContext(ctx, "shop: refund: the payment provider did not answer; the key is released and the completer resumes the refund", "error", err)
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusServiceUnavailable, CodeProviderUnavailable, "Payment provider unavailable",
			"the payment provider did not answer the refund; retry with the same Idempotency-Key (the shop also finishes it on its own)")
	default:
		s.fail(w, r, "refund order", err)
	}
}
