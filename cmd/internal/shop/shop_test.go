package shop_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/sqlstore"
)

// newShop returns a shop over a fresh, migrated database of backend b,
// seeded with the default catalogue (SKU-1, BOOK-1, coupon 1).
func newShop(t *testing.T, b backend) (*shop.Shop, *sql.DB) {
	t.Helper()
	return newShopWith(t, b, shop.DefaultCatalog())
}

// newShopWith returns a shop over a fresh, migrated database of backend b,
// seeded with c.
func newShopWith(t *testing.T, b backend, c shop.Catalog) (*shop.Shop, *sql.DB) {
	t.Helper()
	db, _ := b.fresh(t)
	return shopOn(t, db, b.dialect, c), db
}

// shopOn migrates db (twice: migrating is idempotent), seeds it with c and
// returns a shop over it.
func shopOn(t *testing.T, db *sql.DB, d sqlstore.Dialect, c shop.Catalog) *shop.Shop {
	t.Helper()
	return shopOnWith(t, db, d, c, nil)
}

// shopOnWith is shopOn with the shop's Config changed by mod (when not
// nil) before New.
func shopOnWith(t *testing.T, db *sql.DB, d sqlstore.Dialect, c shop.Catalog, mod func(*shop.Config)) *shop.Shop {
	t.Helper()
	ctx := context.Background()
	store, err := sqlstore.New(db, &sqlstore.Config{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := shop.Migrate(ctx, db, d); err != nil {
		t.Fatal(err)
	}
	if err := shop.Migrate(ctx, db, d); err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	if err := shop.Seed(ctx, db, d, c); err != nil {
		t.Fatal(err)
	}
	cfg := shop.Config{DB: db, Dialect: d, Store: store, Logger: testLogger()}
	if mod != nil {
		mod(&cfg)
	}
	if cfg.Provider == nil {
		cfg.Provider = testProvider(t)
	}
	s, err := shop.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// testLogger is the shops' logger in tests: the errors they log, on stderr,
// when SHOP_TEST_LOG is set (nil, a discarding logger, otherwise).
func testLogger() *slog.Logger {
	if os.Getenv("SHOP_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

func serve(s http.Handler, method, target string, header map[string]string, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	for k, v := range header {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	return rec
}

func problemCode(t *testing.T, rec *httptest.ResponseRecorder) string {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/problem+json") {
		t.Errorf("Content-Type %q, want application/problem+json", ct)
	}
	var p struct {
		Code   string
		Status int
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", rec.Body, err)
	}
	if p.Status != rec.Code {
		t.Errorf("problem status %d, response status %d", p.Status, rec.Code)
	}
	return p.Code
}

func TestCreateOrderRejectsBadInput(t *testing.T) {
	forBackends(t, testCreateOrderRejectsBadInput)
}

func testCreateOrderRejectsBadInput(t *testing.T, b backend) {
	s, db := newShop(t, b)
	cases := []struct {
		name   string
		header map[string]string
		body   string
		status int
		code   string
	}{
		{"no user", map[string]string{"Idempotency-Key": "k1"}, `{"sku":"A","quantity":1}`, 401, "UNAUTHENTICATED"},
		{"user zero", map[string]string{"X-User-ID": "0", "Idempotency-Key": "k1"}, `{"sku":"A","quantity":1}`, 401, "UNAUTHENTICATED"},
		{"user not a number", map[string]string{"X-User-ID": "abc", "Idempotency-Key": "k1"}, `{"sku":"A","quantity":1}`, 401, "UNAUTHENTICATED"},
		{"user with sign", map[string]string{"X-User-ID": "+5", "Idempotency-Key": "k1"}, `{"sku":"A","quantity":1}`, 401, "UNAUTHENTICATED"},
		{"no key", map[string]string{"X-User-ID": "1"}, `{"sku":"A","quantity":1}`, 400, "MISSING_KEY"},
		{"key too long", map[string]string{"X-User-ID": "1", "Idempotency-Key": strings.Repeat("k", 256)}, `{"sku":"A","quantity":1}`, 400, "INVALID_KEY"},
		{"empty body", map[string]string{"X-User-ID": "1", "Idempotency-Key": "k2"}, ``, 400, "INVALID_REQUEST"},
		{"not json", map[string]string{"X-User-ID": "1", "Idempotency-Key": "k3"}, `sku=A`, 400, "INVALID_REQUEST"},
		{"unknown field", map[string]string{"X-User-ID": "1", "Idempotency-Key": "k4"}, `{"sku":"A","quantity":1,"price":0}`, 400, "INVALID_REQUEST"},
		{"no sku", map[string]string{"X-User-ID": "1", "Idempotency-Key": "k5"}, `{"quantity":1}`, 400, "INVALID_REQUEST"},
		{"bad sku", map[string]string{"X-User-ID": "1", "Idempotency-Key": "k6"}, `{"sku":"a b","quantity":1}`, 400, "INVALID_REQUEST"},
		{"no quantity", map[string]string{"X-User-ID": "1", "Idempotency-Key": "k7"}, `{"sku":"A"}`, 400, "INVALID_REQUEST"},
		{"quantity zero", map[string]string{"X-User-ID": "1", "Idempotency-Key": "k8"}, `{"sku":"A","quantity":0}`, 400, "INVALID_REQUEST"},
		{"quantity too big", map[string]string{"X-User-ID": "1", "Idempotency-Key": "k9"}, `{"sku":"A","quantity":1001}`, 400, "INVALID_REQUEST"},
		{"quantity fraction", map[string]string{"X-User-ID": "1", "Idempotency-Key": "k10"}, `{"sku":"A","quantity":1.5}`, 400, "INVALID_REQUEST"},
		{"quantity string", map[string]string{"X-User-ID": "1", "Idempotency-Key": "k11"}, `{"sku":"A","quantity":"1"}`, 400, "INVALID_REQUEST"},
		{"two objects", map[string]string{"X-User-ID": "1", "Idempotency-Key": "k12"}, `{"sku":"A","quantity":1}{}`, 400, "INVALID_REQUEST"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec := serve(s, "POST", "/orders", c.header, c.body)
			if rec.Code != c.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, c.status, rec.Body)
			}
			if code := problemCode(t, rec); code != c.code {
				t.Fatalf("code %q, want %q", code, c.code)
			}
		})
	}
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM shop_orders`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d orders after bad input (err %v), want 0", n, err)
	}
	// A 400 is stored and replayed: the retry gets the same error, the handler does not run again.
	h := map[string]string{"X-User-ID": "1", "Idempotency-Key": "k8"}
	rec := serve(s, "POST", "/orders", h, `{"sku":"A","quantity":0}`)
	if rec.Code != 400 || rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry of a 400: %d replayed=%q", rec.Code, rec.Header().Get("Idempotent-Replayed"))
	}
}

func TestCreateThenReadOrders(t *testing.T) {
	forBackends(t, testCreateThenReadOrders)
}

func testCreateThenReadOrders(t *testing.T, b backend) {
	s, db := newShop(t, b)
	h := map[string]string{"X-User-ID": "5", "Idempotency-Key": "first", "Content-Type": "application/json"}
	rec := serve(s, "POST", "/orders", h, `{"sku":"BOOK-1","quantity":3}`)
	if rec.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", rec.Code, rec.Body)
	}
	var o shop.Order
	if err := json.Unmarshal(rec.Body.Bytes(), &o); err != nil {
		t.Fatal(err)
	}
	if o.UserID != 5 || o.SKU != "BOOK-1" || o.Quantity != 3 || o.Status != "WAIT_PAY" || o.OrderNo == "" || o.CreatedAt == "" {
		t.Fatalf("order %+v", o)
	}
	if loc := rec.Header().Get("Location"); loc != "/orders/"+o.OrderNo {
		t.Errorf("Location %q", loc)
	}
	h["Idempotency-Key"] = "second"
	rec = serve(s, "POST", "/orders", h, `{"sku":"SKU-1","quantity":1}`)
	if rec.Code != http.StatusCreated {
		t.Fatalf("create 2: %d %s", rec.Code, rec.Body)
	}
	var n int
	db.QueryRow(`SELECT COUNT(*) FROM shop_orders WHERE user_id = 5`).Scan(&n)
	if n != 2 {
		t.Fatalf("%d rows, want 2", n)
	}
	rec = serve(s, "GET", "/orders", map[string]string{"X-User-ID": "5"}, "")
	var list struct{ Orders []shop.Order }
	if err := json.Unmarshal(rec.Body.Bytes(), &list); err != nil || len(list.Orders) != 2 {
		t.Fatalf("list: %d %s", rec.Code, rec.Body)
	}
	if list.Orders[0].SKU != "SKU-1" || list.Orders[1].SKU != "BOOK-1" {
		t.Fatalf("not newest first: %+v", list.Orders)
	}
	rec = serve(s, "GET", "/orders?limit=1", map[string]string{"X-User-ID": "5"}, "")
	json.Unmarshal(rec.Body.Bytes(), &list)
	if len(list.Orders) != 1 {
		t.Fatalf("limit=1 gave %d", len(list.Orders))
	}
	for _, bad := range []string{"0", "-1", "x", "501"} {
		rec = serve(s, "GET", "/orders?limit="+bad, map[string]string{"X-User-ID": "5"}, "")
		if rec.Code != 400 || problemCode(t, rec) != "INVALID_REQUEST" {
			t.Errorf("limit=%s: %d %s", bad, rec.Code, rec.Body)
		}
	}
	rec = serve(s, "GET", "/orders/"+o.OrderNo, map[string]string{"X-User-ID": "6"}, "")
	if rec.Code != http.StatusNotFound || problemCode(t, rec) != "NOT_FOUND" {
		t.Fatalf("other user's order: %d", rec.Code)
	}
	rec = serve(s, "GET", "/orders/nope", map[string]string{"X-User-ID": "5"}, "")
	if rec.Code != http.StatusNotFound {
		t.Fatalf("missing order: %d", rec.Code)
	}
}

func TestUnknownRoutesAnswerProblems(t *testing.T) {
	s, _ := newShop(t, sqliteBackend)
	for _, c := range []struct {
		method, target string
		status         int
		code, allow    string
	}{
		{"PUT", "/orders", 405, "METHOD_NOT_ALLOWED", "GET, POST"},
		{"DELETE", "/orders/ord_1", 405, "METHOD_NOT_ALLOWED", "GET"},
		{"POST", "/healthz", 405, "METHOD_NOT_ALLOWED", "GET"},
		{"GET", "/nope", 404, "NOT_FOUND", ""},
		{"GET", "/orders/a/b", 404, "NOT_FOUND", ""},
		{"GET", "/orders/", 404, "NOT_FOUND", ""},
		{"POST", "/orders/", 404, "NOT_FOUND", ""},
		{"GET", "/orders/ord_1/cancel", 405, "METHOD_NOT_ALLOWED", "POST"},
		{"GET", "/orders/ord_1/refunds", 405, "METHOD_NOT_ALLOWED", "POST"},
		{"GET", "/orders/ord_1/card-checkout", 405, "METHOD_NOT_ALLOWED", "POST"},
		{"DELETE", "/coupons/1/claim", 405, "METHOD_NOT_ALLOWED", "POST"},
		{"POST", "/users/me/coupons", 405, "METHOD_NOT_ALLOWED", "GET"},
		{"POST", "/coupons/1/claim/x", 404, "NOT_FOUND", ""},
	} {
		rec := serve(s, c.method, c.target, map[string]string{"X-User-ID": "1"}, "")
		if rec.Code != c.status || problemCode(t, rec) != c.code || rec.Header().Get("Allow") != c.allow {
			t.Errorf("%s %s: %d %q Allow %q", c.method, c.target, rec.Code, rec.Body, rec.Header().Get("Allow"))
		}
	}
}

// Go's encoding/json matches member names case-insensitively and lets the
// last duplicate win, so these bodies could be read as another order than
// the one they seem to ask for. The shop refuses them with 400 and creates
// nothing.
func TestCreateOrderRefusesAmbiguousJSON(t *testing.T) {
	forBackends(t, testCreateOrderRefusesAmbiguousJSON)
}

func testCreateOrderRefusesAmbiguousJSON(t *testing.T, b backend) {
	s, db := newShop(t, b)
	for i, c := range []struct {
		name, body, detail string
	}{
		{"upper-case name", `{"SKU":"A","quantity":1}`, `"SKU"`},
		{"title-case name", `{"sku":"A","Quantity":1}`, `"Quantity"`},
		{"duplicate", `{"sku":"A","quantity":1,"quantity":5}`, `"quantity"`},
		{"case-variant duplicate", `{"sku":"A","quantity":1,"Quantity":5}`, `"Quantity"`},
		{"case-variant duplicate first", `{"Quantity":5,"sku":"A","quantity":1}`, `"Quantity"`},
		{"escaped duplicate", `{"sku":"A","s\u006bu":"B","quantity":1}`, `"sku"`},
		{"unknown field", `{"sku":"A","quantity":1,"price":0}`, `"price"`},
		{"null sku", `{"sku":null,"quantity":1}`, "sku"},
		{"null quantity", `{"sku":"A","quantity":null}`, "quantity"},
		{"array", `[{"sku":"A","quantity":1}]`, "object"},
		{"trailing comma", `{"sku":"A","quantity":1,}`, "JSON"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := map[string]string{"X-User-ID": "3", "Idempotency-Key": "ambiguous-" + strconv.Itoa(i)}
			rec := serve(s, "POST", "/orders", h, c.body)
			if rec.Code != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", rec.Code, rec.Body)
			}
			p := problemOf(t, rec)
			if p.Code != "INVALID_REQUEST" || !strings.Contains(p.Detail, c.detail) {
				t.Fatalf("code %q detail %q, want INVALID_REQUEST and a detail naming %s", p.Code, p.Detail, c.detail)
			}
		})
	}
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM shop_orders`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d orders after ambiguous bodies (err %v), want 0", n, err)
	}
	// The exact names, once each, in any order, still create the order.
	h := map[string]string{"X-User-ID": "3", "Idempotency-Key": "plain"}
	if rec := serve(s, "POST", "/orders", h, `{"quantity":2,"sku":"SKU-1"}`); rec.Code != http.StatusCreated {
		t.Fatalf("plain body: %d %s", rec.Code, rec.Body)
	}
	var qty int
	if err := db.QueryRow(`SELECT quantity FROM shop_orders WHERE user_id = 3`).Scan(&qty); err != nil || qty != 2 {
		t.Fatalf("quantity %d (err %v), want 2", qty, err)
	}
}

// A request with two X-User-ID fields names two callers: it is refused
// with 400, as idemhttp refuses two Idempotency-Key fields, and runs
// nothing.
func TestDuplicateUserHeaderRefused(t *testing.T) {
	t.Parallel()
	s, db := newShop(t, sqliteBackend)
	for _, c := range []struct {
		method, target, body string
	}{
		{"POST", "/orders", `{"sku":"A","quantity":1}`},
		{"GET", "/orders", ""},
		{"GET", "/orders/ord_1", ""},
	} {
		req := httptest.NewRequest(c.method, c.target, strings.NewReader(c.body))
		req.Header.Add("X-User-ID", "1")
		req.Header.Add("x-user-id", "2")
		req.Header.Set("Idempotency-Key", "dup-user")
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != http.StatusBadRequest {
			t.Errorf("%s %s: status %d, want 400: %s", c.method, c.target, rec.Code, rec.Body)
			continue
		}
		if p := problemOf(t, rec); p.Code != "INVALID_REQUEST" || !strings.Contains(p.Detail, "X-User-ID") {
			t.Errorf("%s %s: code %q detail %q", c.method, c.target, p.Code, p.Detail)
		}
	}
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM shop_orders`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d orders (err %v), want 0", n, err)
	}
}

type problem struct {
	Type, Title, Detail, Code string
	Status                    int
}

// problemOf decodes a problem+json answer.
func problemOf(t *testing.T, rec *httptest.ResponseRecorder) problem {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q, want application/problem+json", ct)
	}
	var p problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", rec.Body, err)
	}
	if p.Status != rec.Code {
		t.Errorf("problem status %d, response status %d", p.Status, rec.Code)
	}
	return p
}

// Every problem the shop answers has a type that is the address of the
// section documenting its code: the middleware's codes in
// idemhttp/PROBLEMS.md, the shop's own in cmd/internal/shop/PROBLEMS.md.
func TestProblemTypesAreDocumented(t *testing.T) {
	t.Parallel()
	s, db := newShop(t, sqliteBackend)
	user := map[string]string{"X-User-ID": "1"}
	answers := map[string]*httptest.ResponseRecorder{
		"NOT_FOUND":          serve(s, "GET", "/nope", nil, ""),
		"METHOD_NOT_ALLOWED": serve(s, "PUT", "/orders", user, ""),
		"UNAUTHENTICATED":    serve(s, "GET", "/orders", nil, ""),
		"INVALID_REQUEST":    serve(s, "GET", "/orders?limit=0", user, ""),
		"MISSING_KEY":        serve(s, "POST", "/orders", user, `{"sku":"A","quantity":1}`),
		"UNKNOWN_SKU":        serve(s, "POST", "/orders", map[string]string{"X-User-ID": "1", "Idempotency-Key": "u"}, `{"sku":"A","quantity":1}`),
		"OUT_OF_STOCK":       serve(s, "POST", "/orders", map[string]string{"X-User-ID": "1", "Idempotency-Key": "o"}, `{"sku":"SKU-1","quantity":101}`),
		"COUPON_NOT_USABLE":  serve(s, "POST", "/orders", map[string]string{"X-User-ID": "1", "Idempotency-Key": "c"}, `{"sku":"SKU-1","quantity":1,"coupon_id":1}`),
	}
	// The orders table gone: creating an order fails inside the handler.
	mustExec(t, db, "DROP TABLE shop_orders")
	answers["INTERNAL"] = serve(s, "POST", "/orders", map[string]string{"X-User-ID": "1", "Idempotency-Key": "k"}, `{"sku":"SKU-1","quantity":1}`)
	db.Close()
	answers["UNHEALTHY"] = serve(s, "GET", "/healthz", nil, "")

	docs := map[string]string{
		"https://github.com/idemkit/idem/blob/main/idemhttp/PROBLEMS.md#":          "../../../idemhttp/PROBLEMS.md",
		"https://github.com/idemkit/idem/blob/main/cmd/internal/shop/PROBLEMS.md#": "PROBLEMS.md",
	}
	for code, rec := range answers {
		p := problemOf(t, rec)
		if p.Code != code {
			t.Errorf("answer meant to be %s is %d %s", code, rec.Code, rec.Body)
			continue
		}
		base, fragment, ok := strings.Cut(p.Type, "#")
		file := docs[base+"#"]
		if !ok || file == "" || fragment != strings.ToLower(code) {
			t.Errorf("%s: type %q is not the address of its section", code, p.Type)
			continue
		}
		doc, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(doc, []byte("\n## "+fragment+"\n")) || !bytes.Contains(doc, []byte("`"+strconv.Itoa(rec.Code)+" "+code+"`")) {
			t.Errorf("%s has no section %q saying `%d %s`", file, fragment, rec.Code, code)
		}
	}
}
