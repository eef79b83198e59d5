package shop_test

import (
	"net/http"
	"strings"
	"testing"
)

// An order number is whatever the path holds: invalid UTF-8, a NUL byte,
// or a value longer than any order number. PostgreSQL refuses such bytes in
// a text parameter and MySQL in a utf8mb4 comparison; the shop must answer
// 404 NOT_FOUND (no order has that number), not 500.
func TestGetOrderHostileOrderNumbers(t *testing.T) {
	forBackends(t, testGetOrderHostileOrderNumbers)
}

func testGetOrderHostileOrderNumbers(t *testing.T, b backend) {
	s, _ := newShop(t, b)
	for _, no := range []string{"%FF", "ord_%C3%28", "%00", "ord%00x", "%ED%A0%80", strings.Repeat("x", 5000), "%F0%9F%98%80"} {
		rec := serve(s, http.MethodGet, "/orders/"+no, map[string]string{"X-User-ID": "7"}, "")
		if rec.Code != http.StatusNotFound {
			t.Errorf("GET /orders/%.40s: %d %s, want 404", no, rec.Code, rec.Body)
			continue
		}
		if code := problemCode(t, rec); code != "NOT_FOUND" {
			t.Errorf("GET /orders/%.40s: code %q, want NOT_FOUND", no, code)
		}
	}
}

// A path not in clean form is redirected by Go's router before any of the
// shop's handlers runs (PROBLEMS.md): POST //orders creates no order and
// stores nothing, so following the redirect with the same Idempotency-Key
// creates the order once.
func TestUncleanPathRedirectsWithoutEffect(t *testing.T) {
	t.Parallel()
	s, db := newShop(t, sqliteBackend)
	h := map[string]string{"X-User-ID": "8", "Idempotency-Key": "unclean", "Content-Type": "application/json"}
	body := `{"sku":"UNCLEAN","quantity":2}`
	for _, target := range []string{"http://shop//orders", "http://shop/orders/../orders", "http://shop/orders/x/../../orders"} {
		rec := serve(s, http.MethodPost, target, h, body)
		if rec.Code != http.StatusTemporaryRedirect || rec.Header().Get("Location") != "/orders" {
			t.Errorf("POST %s: %d Location %q, want 307 to /orders", target, rec.Code, rec.Header().Get("Location"))
		}
	}
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM shop_orders WHERE user_id = 8`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d orders after redirects (%v), want 0", n, err)
	}
	rec := serve(s, http.MethodPost, "/orders", h, body)
	if rec.Code != http.StatusCreated || rec.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("POST /orders after the redirect: %d replayed=%q, want a first 201", rec.Code, rec.Header().Get("Idempotent-Replayed"))
	}
	if err := db.QueryRow(`SELECT COUNT(*) FROM shop_orders WHERE user_id = 8`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d orders (%v), want 1", n, err)
	}
}
