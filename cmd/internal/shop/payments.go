package shop

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/uniq"
)

// Payment callbacks. A payment provider tells the shop that an order was
// paid with POST /payments/callback, signed with a secret the two share;
// it sends no Idempotency-Key and repeats the callback until it gets a
// 2xx answer (and sometimes after). See the package documentation for
// what the shop answers.

// DevPaySecret is the secret of payment callbacks when none is
// configured: shopd uses it, and says so at startup, when neither
// -pay-secret nor SHOPD_PAY_SECRET gives one. Anyone who reads this can
// sign a callback: it is for trying the shop out, never for production.
const DevPaySecret = "dev-pay-secret"

// PaySignatureHeader is the header of a payment callback's signature:
//
//	Pay-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>
//
// Several v1 values may be given (a provider that rotates its secret signs
// with the old and the new one for a while); one that matches is enough.
// Parts other than t and v1 are ignored.
const PaySignatureHeader = "Pay-Signature"

// PaySignatureTolerance is how far a signature's timestamp may be from the
// shop's clock, in the past or in the future: a signed callback captured
// by someone else can be replayed for this long at most (and is then
// answered from the idempotency record or the payment row, changing
// nothing).
const PaySignatureTolerance = 5 * time.Minute

// PaymentSuccess is the status of a callback that reports a payment.
const PaymentSuccess = "SUCCESS"

// Limits of a payment callback.
const (
	// maxCallbackBody bounds a callback's body: it is read in full before
	// its signature is checked.
	maxCallbackBody = 16 << 10
	// maxPaySignature bounds the Pay-Signature header that is parsed.
	maxPaySignature = 4 << 10
	// maxPayTimestampDigits: unix seconds fit in 12 digits until the
	// year 33658; more is no timestamp.
	maxPayTimestampDigits = 12
)

// paymentScope is the idempotency scope of payment callbacks: the
// provider, not a user.
const paymentScope = "provider:pay"

// paymentCallbackWait is how long a callback that arrives while an equal
// one is being applied waits for its answer (instead of 409 PROCESSING):
// a provider that sends a callback several times at once gets the same
// 200 for each.
const paymentCallbackWait = 5 * time.Second

// maxPaymentAttempts bounds the times one callback applies its payment
// again when the order changed under it (a cancel racing the payment).
// Deadlocks and serialisation failures are the shop's retry policy's
// (retryTx), within each of these.
const maxPaymentAttempts = 5

// Reasons recorded in shop_reconciliations: why a signed callback was not
// applied.
const (
	reconAmountMismatch   = "AMOUNT_MISMATCH"   // the amount is not the order's
	reconOrderNotPayable  = "ORDER_NOT_PAYABLE" // the order is cancelled, closed or refunded
	reconDuplicatePayment = "DUPLICATE_PAYMENT" // the order was paid already, by another trade
	reconOrderNotFound    = "ORDER_NOT_FOUND"   // no order has this number
	reconTradeConflict    = "TRADE_CONFLICT"    // the trade paid another order, or another amount
)

// tradeNoPattern: a provider's trade number, as the shop stores it.
var tradeNoPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$`)

// payStatusPattern: a callback's status (SUCCESS, FAILED, ...).
var payStatusPattern = regexp.MustCompile(`^[A-Z][A-Z_]{0,31}$`)

// payQueries are the statements of payment callbacks.
type payQueries struct {
	orderForPayment, insertPayment, getPayment string
	insertReconciliation, getReconciliation    string
}

func newPayQueries(d sqlstore.Dialect) payQueries {
	return payQueries{
		orderForPayment: rebind(d, `SELECT status, amount_cents, version FROM shop_orders WHERE order_no = ?`),
		insertPayment:   rebind(d, `INSERT INTO shop_payments (trade_no, order_no, amount_cents, created_ms) VALUES (?, ?, ?, ?)`),
		// A locking read: in a MySQL transaction a plain read would see the
		// transaction's snapshot, older than the payment a duplicate insert
		// collided with.
		getPayment:           rebind(d, `SELECT order_no, amount_cents, created_ms FROM shop_payments WHERE trade_no = ?`+lockingRead(d)),
		insertReconciliation: rebind(d, `INSERT INTO shop_reconciliations (trade_no, order_no, amount_cents, reason, created_ms) VALUES (?, ?, ?, ?, ?)`),
		getReconciliation:    rebind(d, `SELECT reason FROM shop_reconciliations WHERE trade_no = ?`+lockingRead(d)),
	}
}

// SignPayment returns the Pay-Signature header value of a callback body
// signed with secret at time t: "t=<unix seconds>,v1=<hex HMAC-SHA256>".
func SignPayment(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(paySignature(secret, ts, body))
}

// paySignature is HMAC-SHA256(secret, "<ts>.<body>").
func paySignature(secret, ts string, body []byte) []byte {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return mac.Sum(nil)
}

// signedHeader is a parsed Pay-Signature header.
type signedHeader struct {
	// timestamp is t as sent (digits): the signed payload starts with it.
	timestamp string
	unix      int64
	// v1 are the decoded v1 signatures, each sha256.Size bytes.
	v1 [][]byte
}

// errBadSignature is the cause of every refused signature (401
// BAD_SIGNATURE); the error's text says which check failed.
var errBadSignature = errors.New("shop: bad payment signature")

func badSignature(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errBadSignature}, args...)...)
}

// parsePaySignature parses a Pay-Signature header value as Stripe's
// Stripe-Signature is parsed: comma-separated key=value parts, spaces
// around them ignored; exactly one t (unix seconds, digits only); one or
// more v1 (64 hex digits each; a v1 of another shape cannot match and is
// skipped); every other part (another scheme's v0, an empty part, a part
// without '=') is ignored.
func parsePaySignature(h string) (signedHeader, error) {
	if len(h) > maxPaySignature {
		return signedHeader{}, badSignature("the %s header is longer than %d bytes", PaySignatureHeader, maxPaySignature)
	}
	var sig signedHeader
	seenT := false
	for part := range strings.SplitSeq(h, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			continue
		}
		switch k {
		case "t":
			if seenT {
				// Two timestamps: which one was signed is anyone's guess.
				return signedHeader{}, badSignature("more than one t= in the %s header", PaySignatureHeader)
			}
			seenT = true
			if v == "" || len(v) > maxPayTimestampDigits || strings.TrimLeft(v, "0123456789") != "" {
				return signedHeader{}, badSignature("t= must be unix seconds (digits)")
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil { // cannot happen: at most 12 digits
				return signedHeader{}, badSignature("t= must be unix seconds (digits)")
			}
			sig.timestamp, sig.unix = v, n
		case "v1":
			if len(v) != 2*sha256.Size {
				continue
			}
			b, err := hex.DecodeString(v)
			if err != nil {
				continue
			}
			sig.v1 = append(sig.v1, b)
		}
	}
	if !seenT {
		return signedHeader{}, badSignature("the %s header has no t= (unix seconds)", PaySignatureHeader)
	}
	if len(sig.v1) == 0 {
		return signedHeader{}, badSignature("the %s header has no v1= signature (64 hex digits)", PaySignatureHeader)
	}
	return sig, nil
}

// verifyPaySignature checks the Pay-Signature header fields values of a
// callback whose raw body is body: one field, a timestamp within
// PaySignatureTolerance of now (either way), and a v1 that is the
// HMAC-SHA256 of "<t>.<body>" under secret, compared in constant time.
// It returns nil or an error wrapping errBadSignature.
func verifyPaySignature(values []string, body []byte, secret string, now time.Time) error {
	switch len(values) {
	case 0:
		return badSignature("the %s header is missing", PaySignatureHeader)
	case 1:
	default:
		return badSignature("the request has more than one %s header field", PaySignatureHeader)
	}
	sig, err := parsePaySignature(values[0])
	if err != nil {
		return err
	}
	nowUnix := now.Unix()
	tol := int64(PaySignatureTolerance / time.Second)
	switch {
	case sig.unix < nowUnix-tol:
		return badSignature("the signature's timestamp is more than %v old", PaySignatureTolerance)
	case sig.unix > nowUnix+tol:
		return badSignature("the signature's timestamp is more than %v in the future", PaySignatureTolerance)
	}
	want := paySignature(secret, sig.timestamp, body)
	match := 0
	for _, v1 := range sig.v1 {
		// Every candidate is compared, in constant time: the answer's
		// timing says nothing about which one came close.
		match |= subtleEqual(v1, want)
	}
	if match == 0 {
		return badSignature("no v1 signature matches the body")
	}
	return nil
}

// subtleEqual is hmac.Equal as 0 or 1.
func subtleEqual(a, b []byte) int {
	if hmac.Equal(a, b) {
		return 1
	}
	return 0
}

// signedByProvider checks a callback's signature before anything else
// sees it: it reads the body (at most maxCallbackBody bytes: 413
// BODY_TOO_LARGE beyond), verifies the Pay-Signature header (401
// BAD_SIGNATURE), parses the body (400 INVALID_REQUEST) and only then
// hands the request to next, its body intact and the parsed callback in
// its context (callbackFrom). An unsigned request reaches no idempotency
// record and no row.
func (s *Shop) signedByProvider(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxCallbackBody))
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				writeProblem(w, http.StatusRequestEntityTooLarge, idemhttp.CodeBodyTooLarge, "Request body too large",
					fmt.Sprintf("a payment callback's body is at most %d bytes", maxCallbackBody))
				return
			}
			writeProblem(w, http.StatusBadRequest, idemhttp.CodeInvalidRequest, "Invalid request", "cannot read the body")
			return
		}
		if err := verifyPaySignature(r.Header.Values(PaySignatureHeader), body, s.paySecret, time.Now()); err != nil {
			s.log.WarnContext(r.Context(), "shop: payment callback refused", "error", err)
			writeProblem(w, http.StatusUnauthorized, CodeBadSignature, "Bad signature",
				strings.TrimPrefix(err.Error(), errBadSignature.Error()+": "))
			return
		}
		cb, err := parsePaymentCallback(body)
		if err != nil {
			writeProblem(w, http.StatusBadRequest, idemhttp.CodeInvalidRequest, "Invalid request", err.Error())
			return
		}
		r2 := r.WithContext(context.WithValue(r.Context(), callbackKey{}, cb))
		r2.Body = io.NopCloser(bytes.NewReader(body))
		r2.ContentLength = int64(len(body))
		next.ServeHTTP(w, r2)
	})
}

// callbackKey is the context key of a verified callback's parsed body.
type callbackKey struct{}

// callbackFrom returns the callback signedByProvider verified and parsed.
func callbackFrom(ctx context.Context) (paymentCallback, bool) {
	cb, ok := ctx.Value(callbackKey{}).(paymentCallback)
	return cb, ok
}

// paymentCallback is the body of POST /payments/callback.
type paymentCallback struct {
	OrderNo     string `json:"order_no"`
	TradeNo     string `json:"trade_no"`
	AmountCents int64  `json:"amount_cents"`
	Status      string `json:"status"`
}

// parsePaymentCallback reads a callback's body: one JSON object with the
// members order_no, trade_no (strings), amount_cents (an integer, not
// negative) and status (a string of capitals and '_'), each exactly once,
// spelled exactly so (as parseCreateOrder, for the same reason).
func parsePaymentCallback(body []byte) (paymentCallback, error) {
	const shape = `body must be a JSON object {"order_no": string, "trade_no": string, "amount_cents": integer, "status": string}`
	members, err := strictObject(body, "order_no", "trade_no", "amount_cents", "status")
	if err != nil {
		return paymentCallback{}, fmt.Errorf("%s: %v", shape, err)
	}
	var cb paymentCallback
	str := func(name string, dst *string, pattern *regexp.Regexp, want string) error {
		raw, ok := members[name]
		if !ok {
			return fmt.Errorf("%s is required", name)
		}
		if string(raw) == "null" || json.Unmarshal(raw, dst) != nil || !pattern.MatchString(*dst) {
			return fmt.Errorf("%s must be %s", name, want)
		}
		return nil
	}
	if err := str("order_no", &cb.OrderNo, orderNoPattern, "1 to 64 letters, digits, '_' or '-'"); err != nil {
		return paymentCallback{}, err
	}
	if err := str("trade_no", &cb.TradeNo, tradeNoPattern, "1 to 64 letters, digits, '_', '.', ':' or '-', starting with a letter or digit"); err != nil {
		return paymentCallback{}, err
	}
	if err := str("status", &cb.Status, payStatusPattern, `a status of 1 to 32 capitals or '_' ("SUCCESS")`); err != nil {
		return paymentCallback{}, err
	}
	raw, ok := members["amount_cents"]
	if !ok {
		return paymentCallback{}, errors.New("amount_cents is required")
	}
	if string(raw) == "null" || json.Unmarshal(raw, &cb.AmountCents) != nil || cb.AmountCents < 0 {
		return paymentCallback{}, errors.New("amount_cents must be an integer, 0 or more")
	}
	return cb, nil
}

// paymentKey is the idempotency key of a callback: the provider's trade
// number and what the callback says about it. An identical repeat of a
// callback has the same key and replays the first one's answer; a
// callback that says something else about the same trade (another status,
// order or amount) is no repeat: it reaches the business guards, which
// apply it or record it for reconciliation, instead of being answered 422
// KEY_MISMATCH.
func paymentKey(cb paymentCallback) string {
	return "trade:" + cb.TradeNo + ":" + cb.Status + ":" + cb.OrderNo + ":" + strconv.FormatInt(cb.AmountCents, 10)
}

// paymentRefusal is a signed callback the shop does not apply: it is
// recorded in shop_reconciliations with reason and answered with problem.
type paymentRefusal struct {
	reason  string
	problem *problemError
}

func refuse(reason string, status int, code, title, detail string) *paymentRefusal {
	return &paymentRefusal{reason, &problemError{status, code, title, detail}}
}

// errOrderMoved: the order changed between its read and the transition
// (its version moved); the callback's transaction runs again.
var errOrderMoved = errors.New("shop: the order changed while its payment was applied")

// callbackAccepted is the answer to a callback the shop applied, found
// applied already, or acknowledged without effect.
var callbackAccepted = mustJSONResponse(http.StatusOK, map[string]string{"result": "SUCCESS"})

func mustJSONResponse(status int, v any) idem.Response {
	resp, err := idemhttp.JSONResponse(status, v)
	if err != nil {
		panic(err)
	}
	return resp
}

func (s *Shop) paymentCallback(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	cb, ok := callbackFrom(ctx)
	if !ok { // cannot happen: the route is wrapped by signedByProvider
		s.fail(w, r, "payment callback", errors.New("shop: a payment callback reached its handler unverified"))
		return
	}
	var err error
	if cb.Status != PaymentSuccess {
		// A failed (or any other) outcome changes nothing: the order stays
		// WAIT_PAY, payable by another trade, until it is paid, cancelled
		// or closed. Acknowledged, so the provider stops sending it.
		s.log.InfoContext(ctx, "shop: payment callback without a payment acknowledged",
			"order_no", cb.OrderNo, "trade_no", cb.TradeNo, "status", cb.Status)
		idemhttp.WriteResponse(w, callbackAccepted)
		return
	}
	var refusal *paymentRefusal
	for attempt := 1; ; attempt++ {
		err = s.retryTx(ctx, func() error {
			var err error
			refusal, err = s.applyPayment(ctx, cb, func(tx *sql.Tx) error { return s.completeCallback(ctx, tx) })
			return err
		})
		if err == nil || attempt == maxPaymentAttempts || !errors.Is(err, errOrderMoved) {
			break
		}
	}
	if err != nil {
		if errors.Is(err, idem.ErrLeaseLost) {
			w.Header().Set("Retry-After", "1")
			writeProblem(w, http.StatusConflict, idemhttp.CodeProcessing, "Request in progress",
				"another execution of this callback took over; retry to get its answer")
			return
		}
		s.fail(w, r, "apply payment", err)
		return
	}
	if refusal == nil {
		// applyPayment answers no refusal and no error only after the
		// transaction with the stored answer committed.
		if exec := idemhttp.ExecutionFrom(ctx); exec != nil {
			exec.Confirm()
		}
		idemhttp.WriteResponse(w, callbackAccepted)
		return
	}
	if err := s.reconcile(ctx, cb, refusal.reason); err != nil {
		s.fail(w, r, "record reconciliation", err)
		return
	}
	s.log.WarnContext(ctx, "shop: payment not applied; recorded for reconciliation",
		"order_no", cb.OrderNo, "trade_no", cb.TradeNo, "amount_cents", cb.AmountCents, "reason", refusal.reason)
	writeProblem(w, refusal.problem.status, refusal.problem.code, refusal.problem.title, refusal.problem.detail)
}

// completeCallback completes the callback's idempotency record (when the
// middleware guards it) in tx: the payment and its stored answer commit
// together, or neither does.
func (s *Shop) completeCallback(ctx context.Context, tx *sql.Tx) error {
	exec := idemhttp.ExecutionFrom(ctx)
	if exec == nil {
		return nil
	}
	return exec.CompleteTx(ctx, tx, callbackAccepted)
}

// storedPayment is a row of shop_payments.
type storedPayment struct {
	orderNo     string
	amountCents int64
	createdMS   int64
}

// applyPayment applies a SUCCESS callback in one transaction: it records
// the payment, unique on its trade number, and moves the order WAIT_PAY →
// PAID at the version it read, then runs complete and commits. A trade
// recorded already for this order and amount is success without a second
// row or transition. It returns a refusal (nothing written) when the
// callback must not be applied, errOrderMoved when the order changed under
// it (run it again), or another error.
func (s *Shop) applyPayment(ctx context.Context, cb paymentCallback, complete func(*sql.Tx) error) (*paymentRefusal, error) {
	// The order is read before the transaction starts, so that the
	// transaction's first read (on MySQL, its snapshot) comes after the
	// payment's insert.
	var status string
	var amount, version int64
	switch err := s.db.QueryRowContext(ctx, s.pq.orderForPayment, cb.OrderNo).Scan(&status, &amount, &version); {
	case errors.Is(err, sql.ErrNoRows):
		return refuse(reconOrderNotFound, http.StatusNotFound, CodeOrderNotFound, "Order not found",
			fmt.Sprintf("no order has the number %q; the payment is recorded for reconciliation", cb.OrderNo)), nil
	case err != nil:
		return nil, fmt.Errorf("read order: %w", err)
	}
	if cb.AmountCents != amount {
		return refuse(reconAmountMismatch, http.StatusConflict, CodeAmountMismatch, "Amount mismatch",
			fmt.Sprintf("the payment is %d cents, the order %s costs %d; it is not applied and is recorded for reconciliation",
				cb.AmountCents, cb.OrderNo, amount)), nil
	}
	if status == StatusCancelled || status == StatusClosed {
		// Neither was ever paid (only WAIT_PAY leads there), so no payment
		// of this trade can be recorded for it: refuse without writing.
		return notPayable(cb, status), nil
	}

	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	now := time.Now().UnixMilli()
	pay, created, err := s.recordPayment(ctx, tx, cb, now)
	if err != nil {
		return nil, fmt.Errorf("record payment: %w", err)
	}
	if !created {
		if pay.orderNo != cb.OrderNo || pay.amountCents != cb.AmountCents {
			return refuse(reconTradeConflict, http.StatusConflict, CodeTradeConflict, "Trade conflict",
				fmt.Sprintf("trade %s paid another order or amount already; this callback is not applied and is recorded for reconciliation", cb.TradeNo)), nil
		}
		// This trade was applied before (its payment row and the order's
		// transition committed together): the callback is a repeat.
	} else {
		switch err := s.markOrderPaid(ctx, tx, cb.OrderNo, version); {
		case err == nil:
			// The order moved: its event commits with the transition.
			if err := s.addEvent(ctx, tx, EventOrderPaid, cb.OrderNo); err != nil {
				return nil, err
			}
		case errors.Is(err, errAlreadyPaid):
			// Paid, and not by this trade (whose row did not exist): the
			// customer paid twice. The second payment is not applied.
			return refuse(reconDuplicatePayment, http.StatusConflict, CodeOrderNotPayable, "Order not payable",
				fmt.Sprintf("order %s was paid already by another trade; trade %s is not applied and is recorded for reconciliation (refund it)",
					cb.OrderNo, cb.TradeNo)), nil
		default:
			var illegal *orderStatusError
			if errors.As(err, &illegal) {
				return notPayable(cb, illegal.status), nil
			}
			return nil, err
		}
	}
	if err := complete(tx); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return nil, nil
}

func notPayable(cb paymentCallback, status string) *paymentRefusal {
	return refuse(reconOrderNotPayable, http.StatusConflict, CodeOrderNotPayable, "Order not payable",
		fmt.Sprintf("order %s is %s and cannot be paid; the payment is not applied and is recorded for reconciliation (refund it)",
			cb.OrderNo, status))
}

// recordPayment inserts the payment row of cb, or reads the one its trade
// number has already (insertOrGet: uniq's insert first, read on conflict).
func (s *Shop) recordPayment(ctx context.Context, tx *sql.Tx, cb paymentCallback, now int64) (storedPayment, bool, error) {
	return insertOrGet(ctx, tx,
		func(ctx context.Context, q querier) (storedPayment, error) {
			_, err := q.ExecContext(ctx, s.pq.insertPayment, cb.TradeNo, cb.OrderNo, cb.AmountCents, now)
			return storedPayment{cb.OrderNo, cb.AmountCents, now}, err
		},
		func(ctx context.Context, q querier) (storedPayment, error) {
			var p storedPayment
			err := q.QueryRowContext(ctx, s.pq.getPayment, cb.TradeNo).Scan(&p.orderNo, &p.amountCents, &p.createdMS)
			return p, err
		})
}

// reconcile records a callback that was not applied, once per trade
// number (uniq): a repeat finds the row its trade has, and keeps its first
// reason.
func (s *Shop) reconcile(ctx context.Context, cb paymentCallback, reason string) error {
	_, _, err := uniq.InsertOrGet(ctx, s.db,
		func(ctx context.Context, q uniq.Querier) (string, error) {
			_, err := q.ExecContext(ctx, s.pq.insertReconciliation, cb.TradeNo, cb.OrderNo, cb.AmountCents, reason, time.Now().UnixMilli())
			return reason, err
		},
		func(ctx context.Context, q uniq.Querier) (string, error) {
			var have string
			err := q.QueryRowContext(ctx, s.pq.getReconciliation, cb.TradeNo).Scan(&have)
			return have, err
		})
	return err
}

// errAlreadyPaid: the order is PAID already (the transition's target).
var errAlreadyPaid = errors.New("shop: order already paid")

// orderStatusError: the order is in a state from which it cannot be paid.
type orderStatusError struct{ status string }

func (e *orderStatusError) Error() string { return "shop: order is " + e.status }

// markOrderPaid moves order no from WAIT_PAY to PAID, at version, in tx,
// through the order's state machine (transitionOrder); when it changes
// nothing it says why: errAlreadyPaid, an *orderStatusError (another
// state), errOrderMoved (still WAIT_PAY, another version) or an error.
func (s *Shop) markOrderPaid(ctx context.Context, tx *sql.Tx, orderNo string, version int64) error {
	tr, err := s.transitionOrder(ctx, tx, orderNo, trPay, version)
	var illegal *illegalTransitionError
	var conflict *conflictError
	switch {
	case err == nil && tr.AlreadyApplied:
		return errAlreadyPaid
	case err == nil:
		return nil
	case errors.As(err, &conflict):
		return errOrderMoved
	case errors.As(err, &illegal):
		return &orderStatusError{illegal.Current}
	}
	return fmt.Errorf("mark order paid: %w", err)
}

// tradeNoFor is the trade number of the simulated payment of an order:
// one per order, so paying an order twice repeats the same trade (a
// replay), never a second payment.
func (s *Shop) tradeNoFor(orderNo string) string {
	mac := hmac.New(sha256.New, []byte(s.paySecret))
	mac.Write([]byte("simulated-trade:" + orderNo))
	return "sim_" + hex.EncodeToString(mac.Sum(nil)[:12])
}

// simulatedCallbacks is how many times simulatePayment sends the callback.
const simulatedCallbacks = 3

// simulatePayment pays user's order orderNo as a payment provider would
// report it: it sends the shop's own handler a correctly signed SUCCESS
// callback for the order's amount, three times at once, as providers
// repeat callbacks. The trade number is derived from the order, so paying
// twice sends the same trade again. An order that is not the user's is a
// 404 NOT_FOUND problem; a cancelled or closed one a 409
// ORDER_NOT_PAYABLE problem (and no callback is sent); a paid one is paid
// already (nil). A callback answered otherwise than 200 is returned as its
// problem (a *problemError).
func (s *Shop) simulatePayment(ctx context.Context, user int64, orderNo string) error {
	if !orderNoPattern.MatchString(orderNo) {
		return &problemError{http.StatusNotFound, CodeNotFound, "Not found", "no such order"}
	}
	o, err := scanOrder(s.db.QueryRowContext(ctx, s.q.getOrder, orderNo, user))
	if errors.Is(err, sql.ErrNoRows) {
		return &problemError{http.StatusNotFound, CodeNotFound, "Not found", "no such order"}
	}
	if err != nil {
		return fmt.Errorf("shop: read order: %w", err)
	}
	switch o.Status {
	case StatusCancelled, StatusClosed:
		return notPayable(paymentCallback{OrderNo: orderNo}, o.Status).problem
	case StatusPaid, StatusRefunding, StatusRefunded:
		return nil
	}
	body, err := json.Marshal(paymentCallback{OrderNo: o.OrderNo, TradeNo: s.tradeNoFor(o.OrderNo), AmountCents: o.AmountCents, Status: PaymentSuccess})
	if err != nil {
		return err
	}
	answers := make([]*memoryResponse, simulatedCallbacks)
	var wg sync.WaitGroup
	for i := range answers {
		answers[i] = &memoryResponse{header: http.Header{}}
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "/payments/callback", bytes.NewReader(body))
			if err != nil { // cannot happen: a constant method and URL
				answers[i].status = http.StatusInternalServerError
				return
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(PaySignatureHeader, SignPayment(s.paySecret, time.Now(), body))
			s.handler.ServeHTTP(answers[i], req)
		})
	}
	wg.Wait()
	for _, a := range answers {
		if a.status == 0 {
			a.status = http.StatusOK
		}
		if a.status == http.StatusOK {
			continue
		}
		var p problem
		if json.Unmarshal(a.body.Bytes(), &p) != nil || p.Code == "" {
			return fmt.Errorf("shop: simulated payment callback answered %d: %.200s", a.status, a.body.String())
		}
		return &problemError{a.status, p.Code, p.Title, p.Detail}
	}
	return nil
}

// memoryResponse is the ResponseWriter of an in-process request.
type memoryResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (m *memoryResponse) Header() http.Header { return m.header }

func (m *memoryResponse) WriteHeader(status int) {
	if m.status == 0 {
		m.status = status
	}
}

func (m *memoryResponse) Write(b []byte) (int, error) {
	if m.status == 0 {
		m.status = http.StatusOK
	}
	return m.body.Write(b)
}

// paymentCallbackHandler is POST /payments/callback: the signature is
// checked first (signedByProvider), then the idempotency middleware,
// scoped to the provider and keyed by paymentKey (idemhttp's Config.Key),
// replays a repeated callback's answer (a repeat that comes while the
// first runs waits up to paymentCallbackWait for it), then
// paymentCallback applies it. An Idempotency-Key header the request may
// carry is ignored.
func (s *Shop) paymentCallbackHandler(idm *idemhttp.Middleware) (http.Handler, error) {
	guard, err := idm.With(func(c *idemhttp.Config) {
		c.Scope = func(*http.Request) (string, error) { return paymentScope, nil }
		c.Key = func(r *http.Request, _ []byte) (string, error) {
			cb, ok := callbackFrom(r.Context())
			if !ok {
				return "", errors.New("shop: no verified payment callback")
			}
			return paymentKey(cb), nil
		}
		// The key names everything the callback says (its body has no
		// other member), and the signature vouches for its bytes: the
		// fingerprint is the key's, so that a repeat sent with another
		// Content-Type or other spacing is still a repeat, never 422.
		c.Fingerprint = func(r *http.Request, _ []byte) (idem.Fingerprint, error) {
			cb, ok := callbackFrom(r.Context())
			if !ok {
				return "", errors.New("shop: no verified payment callback")
			}
			sum := sha256.Sum256([]byte(paymentKey(cb)))
			return idem.Fingerprint("shop-payment-v1:" + hex.EncodeToString(sum[:])), nil
		}
		c.KeyOptional = false
		c.Wait = max(c.Wait, paymentCallbackWait)
		c.MaxRequestBody = maxCallbackBody
	})
	if err != nil {
		return nil, err
	}
	return s.signedByProvider(guard.Handler(http.HandlerFunc(s.paymentCallback))), nil
}
