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
