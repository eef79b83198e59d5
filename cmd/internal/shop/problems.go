package shop

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// Problem codes of the shop's own answers (the "code" member of its
// problem+json). The shop also answers with idemhttp's codes
// (UNAUTHENTICATED, INVALID_REQUEST, PROCESSING and the middleware's own);
// PROBLEMS.md in this package lists them all.
const (
	CodeNotFound         = "NOT_FOUND"          // 404
	CodeMethodNotAllowed = "METHOD_NOT_ALLOWED" // 405
	CodeInternal         = "INTERNAL"           // 500
	CodeUnhealthy        = "UNHEALTHY"          // 503
	CodeUnknownSKU       = "UNKNOWN_SKU"        // 400
	CodeOutOfStock       = "OUT_OF_STOCK"       // 409
	CodeCouponNotUsable  = "COUPON_NOT_USABLE"  // 409
	CodeBadSignature     = "BAD_SIGNATURE"      // 401
	CodeOrderNotFound    = "ORDER_NOT_FOUND"    // 404
	CodeAmountMismatch   = "AMOUNT_MISMATCH"    // 409
	CodeOrderNotPayable  = "ORDER_NOT_PAYABLE"  // 409
	CodeTradeConflict    = "TRADE_CONFLICT"     // 409
	// Coupons, cancellations and refunds.
	CodeCouponSoldOut       = "COUPON_SOLD_OUT"       // 409
	CodeOrderNotCancellable = "ORDER_NOT_CANCELLABLE" // 409
	CodeOrderNotRefundable  = "ORDER_NOT_REFUNDABLE"  // 409
	CodeRefundInProgress    = "REFUND_IN_PROGRESS"    // 409, Retry-After
	CodeRefundRefused       = "REFUND_REFUSED"        // 409
	CodeProviderUnavailable = "PROVIDER_UNAVAILABLE"  // 503, Retry-After
	// Card checkouts (POST /orders/{order_no}/card-checkout).
	CodeCheckoutInProgress = "CHECKOUT_IN_PROGRESS" // 409, Retry-After
	CodeCardDeclined       = "CARD_DECLINED"        // 402
	CodeShipmentRefused    = "SHIPMENT_REFUSED"     // 409
	// Submit tokens (POST /orders with Submit-Token).
	CodeInvalidToken        = "INVALID_TOKEN"        // 400
	CodeDuplicateSubmission = "DUPLICATE_SUBMISSION" // 409
	CodeTokenReused         = "TOKEN_REUSED"         // 422
)

// shopCodes are the codes whose problem type is the shop's own.
var shopCodes = map[string]bool{
	CodeNotFound: true, CodeMethodNotAllowed: true, CodeInternal: true, CodeUnhealthy: true,
	CodeUnknownSKU: true, CodeOutOfStock: true, CodeCouponNotUsable: true,
	CodeBadSignature: true, CodeOrderNotFound: true, CodeAmountMismatch: true, CodeOrderNotPayable: true, CodeTradeConflict: true,
	CodeCouponSoldOut: true, CodeOrderNotCancellable: true, CodeOrderNotRefundable: true,
	CodeRefundInProgress: true, CodeRefundRefused: true, CodeProviderUnavailable: true,
	CodeCheckoutInProgress: true, CodeCardDeclined: true, CodeShipmentRefused: true,
	CodeInvalidToken: true, CodeDuplicateSubmission: true, CodeTokenReused: true,
}

// problemError is a refusal the shop answers with a problem: the business
// rules' answers (out of stock, not payable, ...).
type problemError struct {
	status              int
	code, title, detail string
}

func (e *problemError) Error() string { return e.code + ": " + e.detail }

// problemTypeBase + lower-case code is the "type" URI of the shop's own
// problems, in the scheme of idemhttp's: the section of PROBLEMS.md that
// says what the code means and what to do.
const problemTypeBase = "https://github.com/idemkit/idem/blob/main/cmd/internal/shop/PROBLEMS.md#"

// problem is an RFC 9457 answer, its members in idemhttp's order.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Code   string `json:"code"`
}

// writeProblem answers with application/problem+json. The shop's own codes
// get their type here; any other code is idemhttp's, and idemhttp writes it
// with its own type.
func writeProblem(w http.ResponseWriter, status int, code, title, detail string) {
	if !shopCodes[code] {
		idemhttp.WriteProblem(w, status, code, title, detail)
		return
	}
	resp := problemResponse(status, code, title, detail)
	h := w.Header()
	h["Content-Type"] = resp.Header["Content-Type"]
	delete(h, "Content-Length")
	w.WriteHeader(status)
	_, _ = w.Write(resp.Body)
}

// problemResponse is the answer writeProblem writes for one of the shop's
// own codes, as a response to store (an operation's answer, steps.OpConfig.Encode).
func problemResponse(status int, code, title, detail string) idem.Response {
	b, err := json.Marshal(problem{
		Type:   problemTypeBase + strings.ToLower(code),
		Title:  title,
		Status: status,
		Detail: detail,
		Code:   code,
	})
	if err != nil { // cannot happen: strings and an int always encode
		b = []byte(`{"status":` + strconv.Itoa(status) + `,"code":"` + code + `"}`)
	}
	return idem.Response{StatusCode: status, Header: map[string][]string{"Content-Type": {"application/problem+json"}}, Body: b}
}
