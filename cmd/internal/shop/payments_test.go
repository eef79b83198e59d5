package shop_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/sqlstore"
)

const testPaySecret = "test-pay-secret"

// newPayShop returns a shop over a fresh, migrated and seeded database of
// backend b (the default catalogue: SKU-1 costs 1299), its payment
// callbacks signed with testPaySecret; the shop's errors go to the test's
// output.
func newPayShop(t *testing.T, b backend) (*shop.Shop, *sql.DB) {
	t.Helper()
	ctx := context.Background()
	db, _ := b.fresh(t)
	store, err := sqlstore.New(db, &sqlstore.Config{Dialect: b.dialect})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := shop.Migrate(ctx, db, b.dialect); err != nil {
		t.Fatal(err)
	}
	if err := shop.Seed(ctx, db, b.dialect, shop.DefaultCatalog()); err != nil {
		t.Fatal(err)
	}
	s, err := shop.New(shop.Config{DB: db, Dialect: b.dialect, Store: store, PaySecret: testPaySecret, Provider: testProvider(t), Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		t.Fatal(err)
	}
	return s, db
}

// placeOrder creates an order of quantity SKU-1 for user and returns it.
func placeOrder(t *testing.T, s http.Handler, user int64, quantity int) shop.Order {
	t.Helper()
	h := map[string]string{"X-User-ID": strconv.FormatInt(user, 10), "Idempotency-Key": fmt.Sprintf("order-%d-%d", time.Now().UnixNano(), quantity)}
	rec := serve(s, "POST", "/orders", h, fmt.Sprintf(`{"sku":"SKU-1","quantity":%d}`, quantity))
	if rec.Code != http.StatusCreated {
		t.Fatalf("create order: %d %s", rec.Code, rec.Body)
	}
	var o shop.Order
	if err := json.Unmarshal(rec.Body.Bytes(), &o); err != nil {
		t.Fatal(err)
	}
	return o
}

// callbackBody is a callback's JSON body.
func callbackBody(orderNo, tradeNo string, amount int64, status string) string {
	return fmt.Sprintf(`{"order_no":%q,"trade_no":%q,"amount_cents":%d,"status":%q}`, orderNo, tradeNo, amount, status)
}

// callback sends body to POST /payments/callback signed now with
// testPaySecret.
func callback(s http.Handler, body string) *httptest.ResponseRecorder {
	return callbackSigned(s, body, shop.SignPayment(testPaySecret, time.Now(), []byte(body)))
}

func callbackSigned(s http.Handler, body, signature string) *httptest.ResponseRecorder {
	h := map[string]string{"Content-Type": "application/json"}
	if signature != "" {
		h[shop.PaySignatureHeader] = signature
	}
	return serve(s, "POST", "/payments/callback", h, body)
}

// wantSuccess fails t unless rec is 200 {"result":"SUCCESS"}.
func wantSuccess(t *testing.T, rec *httptest.ResponseRecorder) {
	t.Helper()
	if rec.Code != http.StatusOK || strings.TrimSpace(rec.Body.String()) != `{"result":"SUCCESS"}` {
		t.Fatalf("callback answered %d %s, want 200 {\"result\":\"SUCCESS\"}", rec.Code, rec.Body)
	}
}

// wantProblem fails t unless rec is a problem with status and code.
func wantProblem(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status %d, want %d: %s", rec.Code, status, rec.Body)
	}
	if got := problemCode(t, rec); got != code {
		t.Fatalf("code %q, want %q: %s", got, code, rec.Body)
	}
}

// query rewrites ? placeholders as $n for PostgreSQL.
func query(b backend, q string) string {
	if b.dialect != sqlstore.PostgreSQL {
		return q
	}
	var out strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			out.WriteString("$" + strconv.Itoa(n))
			continue
		}
		out.WriteRune(r)
	}
	return out.String()
}

func payCount(t *testing.T, db *sql.DB, b backend, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query(b, q), args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// payOrderRow is what the database holds of an order.
type payOrderRow struct {
	status             string
	version, updatedMS int64
}

func readOrder(t *testing.T, db *sql.DB, b backend, orderNo string) payOrderRow {
	t.Helper()
	var o payOrderRow
	if err := db.QueryRow(query(b, `SELECT status, version, updated_ms FROM shop_orders WHERE order_no = ?`), orderNo).
		Scan(&o.status, &o.version, &o.updatedMS); err != nil {
		t.Fatal(err)
	}
	return o
}

// reconciliation is a row of shop_reconciliations.
type reconciliation struct {
	orderNo string
	amount  int64
	reason  string
}

// reconciliations returns trade's reconciliation rows.
func reconciliations(t *testing.T, db *sql.DB, b backend, trade string) []reconciliation {
	t.Helper()
	rows, err := db.Query(query(b, `SELECT order_no, amount_cents, reason FROM shop_reconciliations WHERE trade_no = ?`), trade)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []reconciliation
	for rows.Next() {
		var r reconciliation
		if err := rows.Scan(&r.orderNo, &r.amount, &r.reason); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestPaymentCallbackPaysOrder(t *testing.T) {
	forBackends(t, testPaymentCallbackPaysOrder)
}

func testPaymentCallbackPaysOrder(t *testing.T, b backend) {
	s, db := newPayShop(t, b)
	o := placeOrder(t, s, 1, 2)
	if o.AmountCents != 2*1299 {
		t.Fatalf("order amount %d, want %d", o.AmountCents, 2*1299)
	}
	before := readOrder(t, db, b, o.OrderNo)
	start := time.Now().UnixMilli()
	body := callbackBody(o.OrderNo, "T-pays-1", o.AmountCents, "SUCCESS")
	wantSuccess(t, callback(s, body))

	var orderNo string
	var amount, createdMS int64
	if err := db.QueryRow(query(b, `SELECT order_no, amount_cents, created_ms FROM shop_payments WHERE trade_no = ?`), "T-pays-1").
		Scan(&orderNo, &amount, &createdMS); err != nil {
		t.Fatalf("payment row: %v", err)
	}
	if orderNo != o.OrderNo || amount != o.AmountCents || createdMS < start {
		t.Errorf("payment row (%s, %d, %d), want (%s, %d, >= %d)", orderNo, amount, createdMS, o.OrderNo, o.AmountCents, start)
	}
	after := readOrder(t, db, b, o.OrderNo)
	if after.status != shop.StatusPaid || after.version != before.version+1 || after.updatedMS < start {
		t.Errorf("order after payment %+v (before %+v), want PAID, version+1, updated_ms the time of the payment (>= %d)", after, before, start)
	}
	// GET /orders/{order_no} shows it paid.
	rec := serve(s, "GET", "/orders/"+o.OrderNo, map[string]string{"X-User-ID": "1"}, "")
	var got shop.Order
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || got.Status != shop.StatusPaid || got.Version != after.version {
		t.Errorf("GET order: %s (%v)", rec.Body, err)
	}

	// The idempotency record is the provider's, keyed by the trade.
	var scope, key string
	if err := db.QueryRow(`SELECT scope, idempotency_key FROM idem_records WHERE scope <> 'user:1'`).Scan(&scope, &key); err != nil {
		t.Fatal(err)
	}
	if scope != "provider:pay" || !strings.HasPrefix(key, "trade:T-pays-1:SUCCESS:") {
		t.Errorf("idempotency record (%q, %q), want the provider's, keyed by the trade", scope, key)
	}
	// The provider repeats it later, signed anew: the same answer, replayed.
	for range 3 {
		rec := callback(s, body)
		wantSuccess(t, rec)
		if rec.Header().Get("Idempotent-Replayed") != "true" {
			t.Errorf("a repeat was not replayed")
		}
	}
	// An Idempotency-Key the request carries is not the key (the trade is),
	// and a repeat without Content-Type is still a repeat.
	req := httptest.NewRequest("POST", "/payments/callback", strings.NewReader(body))
	req.Header.Set(shop.PaySignatureHeader, shop.SignPayment(testPaySecret, time.Now(), []byte(body)))
	req.Header.Set("Idempotency-Key", "chosen-by-the-sender")
	rec = httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	wantSuccess(t, rec)
	if rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("a repeat with an Idempotency-Key of its own was not replayed")
	}
	// Once the record has expired, the payment row and the order's state
	// still make a repeat harmless.
	mustExec(t, db, `DELETE FROM idem_records WHERE scope = 'provider:pay'`)
	rec = callback(s, body)
	wantSuccess(t, rec)
	if rec.Header().Get("Idempotent-Replayed") != "" {
		t.Errorf("a repeat after the record's expiry was replayed")
	}
	if n := payCount(t, db, b, `SELECT COUNT(*) FROM shop_payments`); n != 1 {
		t.Errorf("%d payment rows, want 1", n)
	}
	if again := readOrder(t, db, b, o.OrderNo); again != after {
		t.Errorf("order after repeats %+v, want %+v", again, after)
	}
	if n := payCount(t, db, b, `SELECT COUNT(*) FROM shop_reconciliations`); n != 0 {
		t.Errorf("%d reconciliation rows, want 0", n)
	}
}

// Thirty identical callbacks at once: each answered 200 SUCCESS, one
// payment row, one transition.
func TestPaymentCallbackConcurrentRepeats(t *testing.T) {
	forBackends(t, testPaymentCallbackConcurrentRepeats)
}

func testPaymentCallbackConcurrentRepeats(t *testing.T, b backend) {
	s, db := newPayShop(t, b)
	for _, c := range []struct {
		name    string
		handler http.Handler
	}{
		{"guarded", s},
		// The business guards alone: the unique payment row and the
		// order's conditional transition.
		{"unguarded", shop.UnguardedPaymentCallback(s)},
	} {
		t.Run(c.name, func(t *testing.T) { concurrentRepeats(t, b, s, db, c.handler) })
	}
}

func concurrentRepeats(t *testing.T, b backend, s *shop.Shop, db *sql.DB, h http.Handler) {
	o := placeOrder(t, s, 7, 1)
	trade := "T-concurrent-" + o.OrderNo
	body := callbackBody(o.OrderNo, trade, o.AmountCents, "SUCCESS")
	sig := shop.SignPayment(testPaySecret, time.Now(), []byte(body))
	const n = 30
	answers := make([]*httptest.ResponseRecorder, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			answers[i] = callbackSigned(h, body, sig)
		})
	}
	close(start)
	wg.Wait()
	for i, rec := range answers {
		if rec.Code != http.StatusOK || strings.TrimSpace(rec.Body.String()) != `{"result":"SUCCESS"}` {
			t.Errorf("callback %d: %d %s", i, rec.Code, rec.Body)
		}
	}
	if c := payCount(t, db, b, `SELECT COUNT(*) FROM shop_payments WHERE trade_no = ?`, trade); c != 1 {
		t.Errorf("%d payment rows, want 1", c)
	}
	if got := readOrder(t, db, b, o.OrderNo); got.status != shop.StatusPaid || got.version != o.Version+1 {
		t.Errorf("order %+v, want PAID at version %d (one transition)", got, o.Version+1)
	}
}

// A callback whose signature is missing or wrong is refused before
// anything is read or written: no payment, no reconciliation, no
// idempotency record, the order untouched.
func TestPaymentCallbackBadSignature(t *testing.T) {
	forBackends(t, testPaymentCallbackBadSignature)
}

func testPaymentCallbackBadSignature(t *testing.T, b backend) {
	s, db := newPayShop(t, b)
	o := placeOrder(t, s, 1, 1)
	body := callbackBody(o.OrderNo, "T-unsigned", o.AmountCents, "SUCCESS")
	now := time.Now()
	good := shop.SignPayment(testPaySecret, now, []byte(body))
	ts := strconv.FormatInt(now.Unix(), 10)
	goodV1 := good[strings.Index(good, "v1=")+3:]
	for _, c := range []struct{ name, header string }{
		{"missing", ""},
		{"garbage", "garbage"},
		{"no v1", "t=" + ts},
		{"no t", "v1=" + goodV1},
		{"two t", "t=" + ts + ",t=" + ts + ",v1=" + goodV1},
		{"t not a number", "t=12a,v1=" + goodV1},
		{"t negative", "t=-" + ts + ",v1=" + goodV1},
		{"another secret", shop.SignPayment("another-secret", now, []byte(body))},
		{"another body", shop.SignPayment(testPaySecret, now, []byte(body+" "))},
		{"another t than signed", "t=" + strconv.FormatInt(now.Unix()+1, 10) + ",v1=" + goodV1},
		{"v1 truncated", "t=" + ts + ",v1=" + goodV1[:62]},
		{"v0 only", "t=" + ts + ",v0=" + goodV1},
		{"expired", shop.SignPayment(testPaySecret, now.Add(-shop.PaySignatureTolerance-time.Minute), []byte(body))},
		{"future", shop.SignPayment(testPaySecret, now.Add(shop.PaySignatureTolerance+time.Minute), []byte(body))},
	} {
		t.Run(c.name, func(t *testing.T) {
			wantProblem(t, callbackSigned(s, body, c.header), http.StatusUnauthorized, shop.CodeBadSignature)
		})
	}
	t.Run("two header fields", func(t *testing.T) {
		req := httptest.NewRequest("POST", "/payments/callback", strings.NewReader(body))
		req.Header.Add(shop.PaySignatureHeader, good)
		req.Header.Add(shop.PaySignatureHeader, good)
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		wantProblem(t, rec, http.StatusUnauthorized, shop.CodeBadSignature)
	})
	for table, want := range map[string]int{"shop_payments": 0, "shop_reconciliations": 0, "idem_records": 1} {
		// idem_records holds the order's record only.
		if n := payCount(t, db, b, `SELECT COUNT(*) FROM `+table); n != want {
			t.Errorf("%d rows in %s after refused callbacks, want %d", n, table, want)
		}
	}
	if got := readOrder(t, db, b, o.OrderNo); got.status != shop.StatusWaitPay || got.version != o.Version {
		t.Errorf("order %+v after refused callbacks, want untouched", got)
	}
	// The same callback, correctly signed, is then applied.
	wantSuccess(t, callbackSigned(s, body, good))
}

// A callback whose amount is not the order's is never applied: recorded
// once for reconciliation however often it comes, answered 409.
func TestPaymentCallbackAmountMismatch(t *testing.T) {
	forBackends(t, testPaymentCallbackAmountMismatch)
}

func testPaymentCallbackAmountMismatch(t *testing.T, b backend) {
	s, db := newPayShop(t, b)
	o := placeOrder(t, s, 1, 1)
	body := callbackBody(o.OrderNo, "T-short", o.AmountCents-1, "SUCCESS")
	for range 5 {
		wantProblem(t, callback(s, body), http.StatusConflict, shop.CodeAmountMismatch)
	}
	recs := reconciliations(t, db, b, "T-short")
	if want := (reconciliation{o.OrderNo, o.AmountCents - 1, "AMOUNT_MISMATCH"}); len(recs) != 1 || recs[0] != want {
		t.Errorf("reconciliations %+v, want [%+v]", recs, want)
	}
	if n := payCount(t, db, b, `SELECT COUNT(*) FROM shop_payments`); n != 0 {
		t.Errorf("%d payment rows, want 0", n)
	}
	if got := readOrder(t, db, b, o.OrderNo); got.status != shop.StatusWaitPay || got.version != o.Version {
		t.Errorf("order %+v, want untouched", got)
	}
}

// A payment for a cancelled or closed order is never applied: thirty
// repeats at once get 409 ORDER_NOT_PAYABLE and leave one reconciliation
// row.
func TestPaymentCallbackOrderNotPayable(t *testing.T) {
	forBackends(t, testPaymentCallbackOrderNotPayable)
}

func testPaymentCallbackOrderNotPayable(t *testing.T, b backend) {
	s, db := newPayShop(t, b)
	for _, c := range []struct {
		status  string
		handler http.Handler
	}{
		{shop.StatusCancelled, s},
		{shop.StatusClosed, s},
		{shop.StatusCancelled, shop.UnguardedPaymentCallback(s)},
	} {
		status := c.status
		name := status
		if c.handler != http.Handler(s) {
			name += "/unguarded"
		}
		t.Run(name, func(t *testing.T) {
			o := placeOrder(t, s, 2, 1)
			// Until the cancel endpoint and the close job exist, the order
			// is cancelled or closed as they would: one transition.
			if _, err := db.Exec(query(b, `UPDATE shop_orders SET status = ?, version = version + 1 WHERE order_no = ?`), status, o.OrderNo); err != nil {
				t.Fatal(err)
			}
			trade := "T-late-" + o.OrderNo
			body := callbackBody(o.OrderNo, trade, o.AmountCents, "SUCCESS")
			var wg sync.WaitGroup
			answers := make([]*httptest.ResponseRecorder, 30)
			for i := range answers {
				wg.Go(func() { answers[i] = callback(c.handler, body) })
			}
			wg.Wait()
			for _, rec := range answers {
				wantProblem(t, rec, http.StatusConflict, shop.CodeOrderNotPayable)
			}
			recs := reconciliations(t, db, b, trade)
			if want := (reconciliation{o.OrderNo, o.AmountCents, "ORDER_NOT_PAYABLE"}); len(recs) != 1 || recs[0] != want {
				t.Errorf("reconciliations %+v, want [%+v]", recs, want)
			}
			if n := payCount(t, db, b, `SELECT COUNT(*) FROM shop_payments WHERE order_no = ?`, o.OrderNo); n != 0 {
				t.Errorf("%d payment rows, want 0", n)
			}
			if got := readOrder(t, db, b, o.OrderNo); got.status != status || got.version != o.Version+1 {
				t.Errorf("order %+v, want %s at version %d", got, status, o.Version+1)
			}
		})
	}
}

// The cases where the issue is silent: a second trade for a paid order, a
// trade number reused for another order, an unknown order, a status other
// than SUCCESS, a body that is no callback.
func TestPaymentCallbackEdgeCases(t *testing.T) {
	forBackends(t, testPaymentCallbackEdgeCases)
}

func testPaymentCallbackEdgeCases(t *testing.T, b backend) {
	s, db := newPayShop(t, b)
	paid := placeOrder(t, s, 3, 1)
	wantSuccess(t, callback(s, callbackBody(paid.OrderNo, "T-first", paid.AmountCents, "SUCCESS")))
	paidRow := readOrder(t, db, b, paid.OrderNo)

	t.Run("second trade for a paid order", func(t *testing.T) {
		// The customer paid twice: the second payment is not applied (no
		// second row) but recorded, to be refunded.
		for range 2 {
			wantProblem(t, callback(s, callbackBody(paid.OrderNo, "T-second", paid.AmountCents, "SUCCESS")), http.StatusConflict, shop.CodeOrderNotPayable)
		}
		if recs := reconciliations(t, db, b, "T-second"); len(recs) != 1 || recs[0].reason != "DUPLICATE_PAYMENT" {
			t.Errorf("reconciliations %+v, want one DUPLICATE_PAYMENT", recs)
		}
		if n := payCount(t, db, b, `SELECT COUNT(*) FROM shop_payments WHERE order_no = ?`, paid.OrderNo); n != 1 {
			t.Errorf("%d payment rows for the order, want 1", n)
		}
	})
	t.Run("trade reused for another order", func(t *testing.T) {
		other := placeOrder(t, s, 3, 1) // the same amount
		wantProblem(t, callback(s, callbackBody(other.OrderNo, "T-first", other.AmountCents, "SUCCESS")), http.StatusConflict, shop.CodeTradeConflict)
		if recs := reconciliations(t, db, b, "T-first"); len(recs) != 1 || recs[0] != (reconciliation{other.OrderNo, other.AmountCents, "TRADE_CONFLICT"}) {
			t.Errorf("reconciliations %+v, want one TRADE_CONFLICT for %s", recs, other.OrderNo)
		}
		if got := readOrder(t, db, b, other.OrderNo); got.status != shop.StatusWaitPay {
			t.Errorf("other order %+v, want untouched", got)
		}
	})
	t.Run("unknown order", func(t *testing.T) {
		wantProblem(t, callback(s, callbackBody("ord_nosuchorder", "T-nowhere", 100, "SUCCESS")), http.StatusNotFound, shop.CodeOrderNotFound)
		if recs := reconciliations(t, db, b, "T-nowhere"); len(recs) != 1 || recs[0] != (reconciliation{"ord_nosuchorder", 100, "ORDER_NOT_FOUND"}) {
			t.Errorf("reconciliations %+v, want one ORDER_NOT_FOUND", recs)
		}
	})
	t.Run("failed payment", func(t *testing.T) {
		o := placeOrder(t, s, 3, 1)
		wantSuccess(t, callback(s, callbackBody(o.OrderNo, "T-failed", o.AmountCents, "FAILED")))
		if got := readOrder(t, db, b, o.OrderNo); got.status != shop.StatusWaitPay || got.version != o.Version {
			t.Errorf("order %+v after a FAILED callback, want untouched", got)
		}
		if n := payCount(t, db, b, `SELECT COUNT(*) FROM shop_payments WHERE trade_no = ?`, "T-failed") +
			payCount(t, db, b, `SELECT COUNT(*) FROM shop_reconciliations WHERE trade_no = ?`, "T-failed"); n != 0 {
			t.Errorf("%d rows for a FAILED callback, want 0", n)
		}
		// The same trade then succeeds: it is applied.
		wantSuccess(t, callback(s, callbackBody(o.OrderNo, "T-failed", o.AmountCents, "SUCCESS")))
		if got := readOrder(t, db, b, o.OrderNo); got.status != shop.StatusPaid {
			t.Errorf("order %+v after SUCCESS, want PAID", got)
		}
	})
	t.Run("not a callback", func(t *testing.T) {
		for _, body := range []string{
			``,
			`[]`,
			`{"order_no":"ord_x","trade_no":"T","amount_cents":1}`,
			`{"order_no":"ord_x","trade_no":"T","amount_cents":1.5,"status":"SUCCESS"}`,
			`{"order_no":"ord_x","trade_no":"T","amount_cents":-1,"status":"SUCCESS"}`,
			`{"order_no":"ord_x","trade_no":"T","amount_cents":1,"status":"success"}`,
			`{"order_no":"ord_x","trade_no":"T","amount_cents":1,"status":"SUCCESS","extra":1}`,
			`{"order_no":"ord_x","trade_no":"T","amount_cents":1,"status":"SUCCESS","Status":"FAILED"}`,
			`{"order_no":"../x","trade_no":"T","amount_cents":1,"status":"SUCCESS"}`,
			`{"order_no":"ord_x","trade_no":" T","amount_cents":1,"status":"SUCCESS"}`,
		} {
			wantProblem(t, callback(s, body), http.StatusBadRequest, "INVALID_REQUEST")
		}
	})
	t.Run("body too large", func(t *testing.T) {
		body := `{"order_no":"` + strings.Repeat("x", 20<<10) + `"}`
		wantProblem(t, callback(s, body), http.StatusRequestEntityTooLarge, "BODY_TOO_LARGE")
	})
	t.Run("GET", func(t *testing.T) {
		rec := serve(s, "GET", "/payments/callback", nil, "")
		wantProblem(t, rec, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED")
		if rec.Header().Get("Allow") != "POST" {
			t.Errorf("Allow %q, want POST", rec.Header().Get("Allow"))
		}
	})
	if got := readOrder(t, db, b, paid.OrderNo); got != paidRow {
		t.Errorf("paid order %+v after the edge cases, want %+v", got, paidRow)
	}
	if n := payCount(t, db, b, `SELECT COUNT(*) FROM shop_payments`); n != 2 {
		t.Errorf("%d payment rows, want 2 (T-first, T-failed)", n)
	}
}

// Every problem a payment callback answers with is documented in
// PROBLEMS.md, in a section its type points to.
func TestPaymentProblemsAreDocumented(t *testing.T) {
	t.Parallel()
	s, db := newPayShop(t, sqliteBackend)
	o := placeOrder(t, s, 1, 1)
	answers := map[string]*httptest.ResponseRecorder{
		shop.CodeBadSignature:    callbackSigned(s, "{}", ""),
		shop.CodeAmountMismatch:  callback(s, callbackBody(o.OrderNo, "T-doc-1", 1, "SUCCESS")),
		shop.CodeOrderNotFound:   callback(s, callbackBody("ord_none", "T-doc-2", 1, "SUCCESS")),
		shop.CodeOrderNotPayable: nil,
		shop.CodeTradeConflict:   nil,
	}
	wantSuccess(t, callback(s, callbackBody(o.OrderNo, "T-doc-3", o.AmountCents, "SUCCESS")))
	answers[shop.CodeOrderNotPayable] = callback(s, callbackBody(o.OrderNo, "T-doc-4", o.AmountCents, "SUCCESS"))
	other := placeOrder(t, s, 1, 1)
	answers[shop.CodeTradeConflict] = callback(s, callbackBody(other.OrderNo, "T-doc-3", other.AmountCents, "SUCCESS"))
	_ = db
	doc, err := os.ReadFile("PROBLEMS.md")
	if err != nil {
		t.Fatal(err)
	}
	const base = "https://github.com/idemkit/idem/blob/main/cmd/internal/shop/PROBLEMS.md#"
	for code, rec := range answers {
		p := problemOf(t, rec)
		if p.Code != code {
			t.Errorf("answer meant to be %s is %d %s", code, rec.Code, rec.Body)
			continue
		}
		fragment := strings.ToLower(code)
		if p.Type != base+fragment {
			t.Errorf("%s: type %q, want %q", code, p.Type, base+fragment)
		}
		if !bytes.Contains(doc, []byte("\n## "+fragment+"\n")) || !bytes.Contains(doc, []byte("`"+strconv.Itoa(rec.Code)+" "+code+"`")) {
			t.Errorf("PROBLEMS.md has no section %q saying `%d %s`", fragment, rec.Code, code)
		}
	}
}

// The simulated payment pays the order once: three signed callbacks at
// once, one payment row; paying again sends the same trade, still one row.
func TestSimulatePayment(t *testing.T) {
	forBackends(t, testSimulatePayment)
}

func testSimulatePayment(t *testing.T, b backend) {
	s, db := newPayShop(t, b)
	ctx := context.Background()
	o := placeOrder(t, s, 4, 3)
	if err := shop.SimulatePayment(s, ctx, 5, o.OrderNo); shop.ProblemCode(err) != "NOT_FOUND" {
		t.Errorf("another user's order: %v, want NOT_FOUND", err)
	}
	if n := payCount(t, db, b, `SELECT COUNT(*) FROM shop_payments`); n != 0 {
		t.Fatalf("%d payment rows after another user's attempt, want 0", n)
	}
	for range 2 {
		if err := shop.SimulatePayment(s, ctx, 4, o.OrderNo); err != nil {
			t.Fatal(err)
		}
	}
	var amount int64
	var trades int
	if err := db.QueryRow(query(b, `SELECT COUNT(*), COALESCE(SUM(amount_cents), 0) FROM shop_payments WHERE order_no = ?`), o.OrderNo).Scan(&trades, &amount); err != nil {
		t.Fatal(err)
	}
	if trades != 1 || amount != o.AmountCents {
		t.Errorf("%d payment rows of %d cents in all, want 1 of %d", trades, amount, o.AmountCents)
	}
	if got := readOrder(t, db, b, o.OrderNo); got.status != shop.StatusPaid || got.version != o.Version+1 {
		t.Errorf("order %+v, want PAID at version %d", got, o.Version+1)
	}
	if n := payCount(t, db, b, `SELECT COUNT(*) FROM shop_reconciliations`); n != 0 {
		t.Errorf("%d reconciliation rows, want 0", n)
	}

	cancelled := placeOrder(t, s, 4, 1)
	mustExec(t, db, "UPDATE shop_orders SET status = 'CANCELLED' WHERE order_no = '"+cancelled.OrderNo+"'")
	if err := shop.SimulatePayment(s, ctx, 4, cancelled.OrderNo); shop.ProblemCode(err) != shop.CodeOrderNotPayable {
		t.Errorf("cancelled order: %v, want ORDER_NOT_PAYABLE", err)
	}
	if n := payCount(t, db, b, `SELECT COUNT(*) FROM shop_reconciliations`); n != 0 {
		t.Errorf("%d reconciliation rows after paying a cancelled order, want 0 (nothing sent)", n)
	}
}

// A cancel racing a payment's callbacks: the order ends either PAID, with
// one payment row and every callback answered 200, or CANCELLED, with no
// payment row, one reconciliation row and every callback answered 409
// ORDER_NOT_PAYABLE — never both, never a payment on a cancelled order.
func TestPaymentRacesCancel(t *testing.T) {
	forBackends(t, testPaymentRacesCancel)
}

func testPaymentRacesCancel(t *testing.T, b backend) {
	s, db := newPayShop(t, b)
	unguarded := shop.UnguardedPaymentCallback(s)
	outcomes := map[string]int{}
	for range 6 {
		o := placeOrder(t, s, 9, 1)
		trade := "T-race-" + o.OrderNo
		body := callbackBody(o.OrderNo, trade, o.AmountCents, "SUCCESS")
		start := make(chan struct{})
		var wg sync.WaitGroup
		answers := make([]*httptest.ResponseRecorder, 10)
		for i := range answers {
			h := http.Handler(s)
			if i%2 == 1 {
				h = unguarded
			}
			wg.Go(func() {
				<-start
				answers[i] = callback(h, body)
			})
		}
		wg.Go(func() {
			<-start
			// The owner's cancel, as the cancel endpoint makes it: a
			// conditional transition out of WAIT_PAY.
			if _, err := db.Exec(query(b, `UPDATE shop_orders SET status = 'CANCELLED', version = version + 1 WHERE order_no = ? AND status = 'WAIT_PAY'`), o.OrderNo); err != nil {
				t.Error(err)
			}
		})
		close(start)
		wg.Wait()
		got := readOrder(t, db, b, o.OrderNo)
		outcomes[got.status]++
		payments := payCount(t, db, b, `SELECT COUNT(*) FROM shop_payments WHERE trade_no = ?`, trade)
		recs := reconciliations(t, db, b, trade)
		switch got.status {
		case shop.StatusPaid:
			if payments != 1 || len(recs) != 0 {
				t.Errorf("paid order: %d payment rows and reconciliations %+v, want 1 and none", payments, recs)
			}
			for _, rec := range answers {
				wantSuccess(t, rec)
			}
		case shop.StatusCancelled:
			if payments != 0 || len(recs) != 1 || recs[0].reason != "ORDER_NOT_PAYABLE" {
				t.Errorf("cancelled order: %d payment rows and reconciliations %+v, want none and one ORDER_NOT_PAYABLE", payments, recs)
			}
			for _, rec := range answers {
				wantProblem(t, rec, http.StatusConflict, shop.CodeOrderNotPayable)
			}
		default:
			t.Errorf("order %+v, want PAID or CANCELLED", got)
		}
		if got.version != o.Version+1 {
			t.Errorf("order at version %d, want %d (one transition)", got.version, o.Version+1)
		}
	}
	t.Logf("outcomes: %v", outcomes)
}

// A provider whose connection drops at any moment of a callback (before,
// during or after the key's Acquire, or while the payment is applied)
// leaves no idempotency record in flight: the provider's retry runs at
// once and pays the order, instead of 409 PROCESSING until the lease runs
// out. Before, a cancellation that landed while the Acquire statement
// committed was reported as a failed Acquire (503) with the key held.
func TestCallbackCutOffLeavesNothingInFlight(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, db := newPayShop(t, b)
		store, err := sqlstore.New(db, &sqlstore.Config{Dialect: b.dialect})
		if err != nil {
			t.Fatal(err)
		}
		cut := 0
		for i := range 60 {
			o := placeOrder(t, s, 1, 1)
			trade := fmt.Sprintf("T-cut-%d", i)
			body := callbackBody(o.OrderNo, trade, o.AmountCents, "SUCCESS")
			ctx, cancel := context.WithCancel(context.Background())
			// Cancelled from at once to 3 ms in: every step of the callback.
			stop := time.AfterFunc(time.Duration(i%30)*100*time.Microsecond, cancel)
			req := httptest.NewRequestWithContext(ctx, "POST", "/payments/callback", strings.NewReader(body))
			req.Header.Set(shop.PaySignatureHeader, shop.SignPayment(testPaySecret, time.Now(), []byte(body)))
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, req)
			stop.Stop()
			cancel()
			if rec.Code != http.StatusOK {
				cut++
			}
			key := fmt.Sprintf("trade:%s:SUCCESS:%s:%d", trade, o.OrderNo, o.AmountCents)
			if r, err := store.Get(context.Background(), "provider:pay", key); err == nil && r.Status == idem.StatusProcessing {
				t.Fatalf("callback %d answered %d and left its record in flight (lease until %v): %s", i, rec.Code, r.LeaseUntil, rec.Body)
			}
			wantSuccess(t, callback(s, body)) // the provider's retry
			if st := readOrder(t, db, b, o.OrderNo).status; st != shop.StatusPaid {
				t.Fatalf("order %s is %s after the retry", o.OrderNo, st)
			}
			if n := payCount(t, db, b, `SELECT COUNT(*) FROM shop_payments WHERE order_no = ?`, o.OrderNo); n != 1 {
				t.Fatalf("%d payments of order %s", n, o.OrderNo)
			}
		}
		t.Logf("%d of 60 callbacks were cut off before their answer", cut)
	})
}
