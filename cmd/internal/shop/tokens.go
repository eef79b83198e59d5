package shop

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/token"
)

// Submit tokens (package token, in the shop's database through
// sqlstore's TokenStore): a page (or an API client, with POST /tokens)
// gets a token before it submits, and the submission spends it in the
// order's transaction (Tokens.ConsumeTx), attaching the order's number.
// A second submission of the same order with the same token creates
// nothing: it is led to the order the first one created (303 to the
// order's page, or 409 DUPLICATE_SUBMISSION naming it over the API), for
// a day after the first use (token.DefaultKeep), however long the page
// was open before. A different order under a spent token (another sku,
// quantity or coupon: the token keeps the fingerprint of the order
// request, form and API alike) creates nothing either and is refused
// (422 TOKEN_REUSED, or an error page): it is not the first submission
// repeated, and leading it to the first order would lose it silently. A
// refused order (out of stock, ...) rolls back, and its token stays
// unspent. A user keeps at most token.DefaultMaxLive (20) unused tokens:
// the oldest go when a page or POST /tokens gets a new one. Expired
// tokens are swept by the close job (Closer).

// tokenResponse is the body of POST /tokens.
type tokenResponse struct {
	Token     string `json:"token"`
	ExpiresAt string `json:"expires_at"`
}

// issueToken serves POST /tokens: 201 with a new token for the caller.
func (s *Shop) issueToken(w http.ResponseWriter, r *http.Request) {
	scope, err := scopeOf(r)
	if err != nil {
		s.fail(w, r, "token scope", err)
		return
	}
	tok, err := s.tokens.Issue(r.Context(), scope)
	if err != nil {
		s.fail(w, r, "issue token", err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusCreated, tokenResponse{Token: tok.ID, ExpiresAt: tok.ExpiresAt.UTC().Format(time.RFC3339)})
}

// submitTokenHeader reads the optional Submit-Token header of POST
// /orders: "" when absent; more than one field is an error.
func submitTokenHeader(r *http.Request) (string, error) {
	values := r.Header.Values("Submit-Token")
	switch {
	case len(values) == 0:
		return "", nil
	case len(values) > 1:
		return "", errors.New("the request has more than one Submit-Token header field")
	case strings.TrimSpace(values[0]) == "":
		return "", errors.New("the Submit-Token header is empty")
	}
	return strings.TrimSpace(values[0]), nil
}

// spendToken spends the submit token id of user in tx for req, attaching
// req.OrderNo, the number of the order tx is about to create. It returns
// nil when this is the token's first use, a *duplicateSubmissionError
// naming the order of the first use (of the same request), or a
// *problemError INVALID_TOKEN or TOKEN_REUSED (a different request). On
// PostgreSQL and MySQL a concurrent submission of the same token waits
// here for tx, then sees it used (or spends it, if tx rolled back).
func (s *Shop) spendToken(ctx context.Context, tx *sql.Tx, user int64, id string, req orderRequest) error {
	err := s.tokens.ConsumeTx(ctx, tx, userScope(user), id, token.Use{Request: req.canonical(), Result: []byte(req.OrderNo)})
	var used *token.UsedError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, token.ErrMismatch):
		return tokenReused()
	case errors.As(err, &used):
		if len(used.Result) == 0 {
			// Every spend here attaches an order; a token spent by other
			// code cannot be used for an order.
			return invalidToken()
		}
		return &duplicateSubmissionError{orderNo: string(used.Result)}
	case errors.Is(err, token.ErrInvalid):
		return invalidToken()
	}
	return fmt.Errorf("spend submit token: %w", err)
}

func invalidToken() *problemError {
	return &problemError{http.StatusBadRequest, CodeInvalidToken, "Invalid submit token",
		"the submit token is unknown, expired or not yours; get a new one (POST /tokens, or reload the page)"}
}

func tokenReused() *problemError {
	return &problemError{http.StatusUnprocessableEntity, CodeTokenReused, "Submit token used for another order",
		"this submit token was already used for a different order; nothing was created. Reload the page (or POST /tokens) to start a new order"}
}

// canonical is the request a submit token guards, as its fingerprint
// sees it: the order's fields, sorted and escaped (url.Values.Encode),
// the same whether it came as the checkout form or as POST /orders. The
// order number is not part of it: each attempt draws a new one.
func (r orderRequest) canonical() []byte {
	v := url.Values{"sku": {r.SKU}, "quantity": {strconv.Itoa(r.Quantity)}, "coupon_id": {""}}
	if r.CouponID != 0 {
		v.Set("coupon_id", strconv.FormatInt(r.CouponID, 10))
	}
	return []byte(v.Encode())
}

// duplicateSubmissionError: the submit token was spent before, by the
// submission that created orderNo.
type duplicateSubmissionError struct{ orderNo string }

func (e *duplicateSubmissionError) Error() string {
	return "duplicate submission of order " + e.orderNo
}

// writeDuplicateSubmission answers 409 DUPLICATE_SUBMISSION: the problem
// names the order the token created (member "order_no", and Location).
func writeDuplicateSubmission(w http.ResponseWriter, e *duplicateSubmissionError) {
	b, err := json.Marshal(struct {
		problem
		OrderNo string `json:"order_no"`
	}{
		problem: problem{
			Type:   problemTypeBase + strings.ToLower(CodeDuplicateSubmission),
			Title:  "Duplicate submission",
			Status: http.StatusConflict,
			Detail: "this submit token was used before, by the request that created order " + e.orderNo,
			Code:   CodeDuplicateSubmission,
		},
		OrderNo: e.orderNo,
	})
	if err != nil { // cannot happen: strings and an int
		writeProblem(w, http.StatusConflict, CodeDuplicateSubmission, "Duplicate submission", e.Error())
		return
	}
	h := w.Header()
	h["Content-Type"] = []string{"application/problem+json"}
	h["Location"] = []string{"/orders/" + e.orderNo}
	delete(h, "Content-Length")
	w.WriteHeader(http.StatusConflict)
	_, _ = w.Write(b)
}

// userScope is the scope of user's tokens and idempotency keys.
func userScope(user int64) string { return fmt.Sprintf("user:%d", user) }
