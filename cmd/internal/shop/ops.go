package shop

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/payprov"
	"github.com/idemkit/idem/fsm"
	"github.com/idemkit/idem/idemhttp"
)

// The shop's operations of steps (refund.go, cardcheckout.go) store their
// HTTP answer in the request's record themselves (steps.OpConfig.Encode),
// so that the completer, which finishes an operation its client left,
// stores the very bytes the client would have got. encodeOp, decodeOp and
// answerOp are that answer's three sides.

// errProviderUnavailable marks a call to the payment provider whose
// outcome is unknown (a failure, a timeout): the attempt ends, 503
// PROVIDER_UNAVAILABLE, and a retry or the completer calls again under
// the same key.
var errProviderUnavailable = errors.New("shop: the payment provider did not answer")

// holdOrder makes transition name of user's order orderNo (into a state
// an operation of steps holds it in: REFUNDING, CHARGING) with the
// version it read, and again, read anew, when the order changed
// concurrently. It returns the order as read and "" when it moved it, or
// the order's status when the order is in a state the transition does
// not leave (its target included), and nothing moved. No such order (or
// another user's) is a NOT_FOUND *problemError.
func (s *Shop) holdOrder(ctx context.Context, tx *sql.Tx, user int64, orderNo, name string) (Order, string, error) {
	tr, ok := orderMachine.Lookup(name)
	if !ok {
		return Order{}, "", fmt.Errorf("shop: order transition %q is not declared", name)
	}
	for {
		o, err := s.orderOf(ctx, tx, user, orderNo)
		if errors.Is(err, errOrderNotFound) {
			return Order{}, "", problemOrderNotFound
		} else if err != nil {
			return Order{}, "", err
		}
		if !slices.Contains(tr.From, fsm.State(o.Status)) {
			return o, o.Status, nil
		}
		t, err := s.transitionOrder(ctx, tx, orderNo, name, o.Version)
		var illegal *illegalTransitionError
		var conflict *conflictError
		switch {
		case errors.As(err, &conflict):
			continue // read it again
		case errors.As(err, &illegal):
			return o, illegal.Current, nil
		case err != nil:
			return Order{}, "", err
		case t.AlreadyApplied:
			return o, t.To, nil
		}
		return o, "", nil
	}
}

// leaveHeld makes transition name of orderNo out of a state that an
// operation of steps moved it to and holds it in (REFUNDING, CHARGING):
// nothing else moves it from there, so any other outcome is a failure.
func (s *Shop) leaveHeld(ctx context.Context, tx *sql.Tx, orderNo, name string) error {
	t, err := s.transitionOrder(ctx, tx, orderNo, name, 0)
	switch {
	case err != nil:
		return err
	case t.AlreadyApplied:
		return fmt.Errorf("shop: order %s left its state without its operation (transition %s)", orderNo, name)
	}
	return nil
}

// providerCall is a foreign step's checkpoint: the effect's id (and a
// shipment's tracking number), or the provider's definite refusal.
type providerCall struct {
	ID       string `json:"id,omitempty"`
	Tracking string `json:"tracking,omitempty"`
	Refused  string `json:"refused,omitempty"`
	Message  string `json:"message,omitempty"`
}

// callProvider runs a foreign step's call: a refusal is a result (kept,
// so that a resumed run does not ask again), any other error ends the
// attempt as errProviderUnavailable.
func callProvider(call func() (providerCall, error)) (providerCall, error) {
	out, err := call()
	var refused *payprov.RefusedError
	switch {
	case errors.As(err, &refused):
		return providerCall{Refused: refused.Code, Message: refused.Message}, nil
	case err != nil:
		return providerCall{}, fmt.Errorf("%w: %w", errProviderUnavailable, err)
	}
	return out, nil
}

// definiteProblems are the definite errors (*idem.DefiniteError) of the
// shop's operations, by code: the status and title of their problem.
var definiteProblems = map[string]struct {
	status int
	title  string
}{
	CodeRefundRefused:   {http.StatusConflict, "Refund refused"},
	CodeCardDeclined:    {http.StatusPaymentRequired, "Card declined"},
	CodeShipmentRefused: {http.StatusConflict, "Shipment refused"},
}

// inProgress are the codes of refusals that say "another request is at
// it, retry later": answered with Retry-After, never stored.
var inProgress = map[string]bool{CodeRefundInProgress: true, CodeCheckoutInProgress: true}

// encodeOp builds an operation's answer (steps.OpConfig.Encode): status
// and v as JSON for a result; the problem of a definite error
// (definiteProblems) or of a refusal (*problemError, but inProgress's);
// anything else is not stored (the attempt failed; the key is released).
func encodeOp(status int, v any, err error) (idem.Response, error, bool) {
	var de *idem.DefiniteError
	var pe *problemError
	switch {
	case err == nil:
		resp, jerr := idemhttp.JSONResponse(status, v)
		if jerr != nil {
			return idem.Response{}, jerr, false
		}
		return resp, nil, true
	case errors.As(err, &de):
		if p, ok := definiteProblems[de.Code]; ok {
			return problemResponse(p.status, de.Code, p.title, de.Message), err, true
		}
	case errors.As(err, &pe) && !inProgress[pe.code]:
		return problemResponse(pe.status, pe.code, pe.title, pe.detail), err, true
	}
	return idem.Response{}, err, false
}

// decodeOp is encodeOp's inverse (steps.OpConfig.Decode): a 2xx answer
// into v; a definite error's problem into an *idem.DefiniteError; another
// problem into a *problemError.
func decodeOp(resp idem.Response, replayed bool, v any) error {
	if resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(resp.Body, v); err != nil {
			return fmt.Errorf("shop: decode a stored answer: %w", err)
		}
		return nil
	}
	var p problem
	if err := json.Unmarshal(resp.Body, &p); err != nil {
		return fmt.Errorf("shop: decode a stored problem (status %d): %w", resp.StatusCode, err)
	}
	if _, ok := definiteProblems[p.Code]; ok {
		return &idem.DefiniteError{Code: p.Code, Message: p.Detail, Replayed: replayed}
	}
	return &problemError{resp.StatusCode, p.Code, p.Title, p.Detail}
}

// answerOp answers a request whose operation ran (Op.Run) and answered
// resp (stored, when the operation stored it) or err. Under idemhttp a
// stored answer is what the middleware sends; the others release the key:
// 409 PROCESSING when the execution lost its lease, the inProgress
// refusals and 503 PROVIDER_UNAVAILABLE with Retry-After, 422
// KEY_MISMATCH (with Retry-After) when the key's unfinished operation is
// another request's, 500 otherwise.
func (s *Shop) answerOp(w http.ResponseWriter, r *http.Request, what string, resp idem.Response, stored bool, err error) {
	var pe *problemError
	switch {
	case errors.Is(err, idem.ErrLeaseLost):
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusConflict, idemhttp.CodeProcessing, "Request in progress",
			"another execution of this request took over; retry to get its answer")
	case stored:
		idemhttp.WriteResponse(w, resp)
	case errors.Is(err, idem.ErrMismatch):
		// The key's operation, of another request, is unfinished: a
		// retry of that request, or the completer, finishes it. Not
		// stored (Retry-After), so that the retry may take the key.
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusUnprocessableEntity, idemhttp.CodeKeyMismatch, "Idempotency key reused",
			"this Idempotency-Key belongs to another request, whose operation is not finished; use a new key for this request")
	case errors.As(err, &pe):
		// Retry-After makes idemhttp release the key.
		w.Header().Set("Retry-After", "1")
		writeProblem(w, pe.status, pe.code, pe.title, pe.detail)
	case errors.Is(err, errProviderUnavailable):
		s.log.WarnContext(r.Context(), "shop: the payment provider did not answer; the key is released and the completer resumes the operation", "op", what, "error", err)
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusServiceUnavailable, CodeProviderUnavailable, "Payment provider unavailable",
			"the payment provider did not answer; retry with the same Idempotency-Key (the shop also finishes the request on its own)")
	default:
		s.fail(w, r, what, err)
	}
}
