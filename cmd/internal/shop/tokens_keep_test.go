package shop_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// A checkout page left open 25 minutes, submitted, then sent again a day
// later (23h59m after the first submission: the token's row moved back
// in time, the database's clock being the store's) is still led to its
// order: the used token is kept 24 hours after its use, not 30 minutes
// after its issue. One order, one reservation.
func TestCheckoutAgainADayLater(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, db := webShop(t, b)
		tok := formToken(t, s, 6)
		form := url.Values{"sku": {"SKU-1"}, "quantity": {"1"}, "coupon_id": {""}, "token": {tok}}
		first := page(s, "POST", "/checkout", 6, form)
		loc := first.Header().Get("Location")
		if first.Code != http.StatusSeeOther || !strings.HasPrefix(loc, "/orders/ord_") {
			t.Fatalf("first submission: %d Location %q\n%s", first.Code, loc, first.Body)
		}
		// 25 minutes open before the use, then 23h59m since: every time
		// of the row moves back by 23h59m (86,340,000 ms).
		mustExec(t, db, `UPDATE idem_tokens SET created_at = created_at - 86340000, expires_at = expires_at - 86340000, used_at = used_at - 86340000 WHERE used_at IS NOT NULL`)
		again := page(s, "POST", "/checkout", 6, form)
		if again.Code != http.StatusSeeOther || again.Header().Get("Location") != loc {
			t.Fatalf("a day later: %d Location %q, want 303 %q\n%s", again.Code, again.Header().Get("Location"), loc, again.Body)
		}
		if n := count(t, db, "SELECT COUNT(*) FROM shop_orders"); n != 1 {
			t.Fatalf("%d orders, want 1", n)
		}
		if n := stock(t, db, "SKU-1"); n != 99 {
			t.Fatalf("stock %d, want 99", n)
		}
		// Over the API too: the same order under the spent token (the
		// fingerprint is the order's, whatever the way it came) is 409
		// naming it; another order is 422 TOKEN_REUSED.
		api := func(key, body string) *http.Response {
			return serve(s, "POST", "/orders", map[string]string{"X-User-ID": "6", "Idempotency-Key": key, "Submit-Token": tok}, body).Result()
		}
		if r := api("day-1", `{"sku":"SKU-1","quantity":1}`); r.StatusCode != http.StatusConflict || r.Header.Get("Location") != loc {
			t.Fatalf("the same order over the API: %d Location %q", r.StatusCode, r.Header.Get("Location"))
		}
	})
}

// A different order under a spent token — the form edited and sent again,
// or POST /orders with another body — is refused, creates nothing and is
// not led to the first order: 422 TOKEN_REUSED over the API, an error
// page for the form. The same order again is still a duplicate.
func TestTokenReusedForAnotherOrder(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, db := webShop(t, b)
		rec := serve(s, "POST", "/tokens", map[string]string{"X-User-ID": "8"}, "")
		var tr struct{ Token string }
		if rec.Code != http.StatusCreated || json.Unmarshal(rec.Body.Bytes(), &tr) != nil {
			t.Fatalf("POST /tokens: %d %s", rec.Code, rec.Body)
		}
		order := func(key, body string) *http.Response {
			return serve(s, "POST", "/orders", map[string]string{"X-User-ID": "8", "Idempotency-Key": key, "Submit-Token": tr.Token}, body).Result()
		}
		if r := order("k1", `{"sku":"SKU-1","quantity":1}`); r.StatusCode != http.StatusCreated {
			t.Fatalf("first: %d", r.StatusCode)
		}
		for key, body := range map[string]string{
			"k2": `{"sku":"SKU-1","quantity":3}`,
			"k3": `{"sku":"BOOK-1","quantity":1}`,
		} {
			rec := serve(s, "POST", "/orders", map[string]string{"X-User-ID": "8", "Idempotency-Key": key, "Submit-Token": tr.Token}, body)
			p := problemOf(t, rec)
			if rec.Code != http.StatusUnprocessableEntity || p.Code != "TOKEN_REUSED" || rec.Header().Get("Location") != "" ||
				!strings.Contains(p.Detail, "different order") || strings.Contains(rec.Body.String(), "ord_") {
				t.Fatalf("%s: %d Location %q %s, want 422 TOKEN_REUSED naming no order", body, rec.Code, rec.Header().Get("Location"), rec.Body)
			}
		}
		if r := order("k4", `{"sku":"SKU-1","quantity":1}`); r.StatusCode != http.StatusConflict {
			t.Fatalf("the same order, another key: %d, want 409 DUPLICATE_SUBMISSION", r.StatusCode)
		}
		// The form: the same token (a form's fields) with another coupon
		// field is another order.
		form := url.Values{"sku": {"SKU-1"}, "quantity": {"1"}, "coupon_id": {"77"}, "token": {tr.Token}}
		if rec := page(s, "POST", "/checkout", 8, form); rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), "different order") {
			t.Fatalf("the form with another coupon: %d\n%s", rec.Code, rec.Body)
		}
		form.Set("coupon_id", "")
		if rec := page(s, "POST", "/checkout", 8, form); rec.Code != http.StatusSeeOther || !strings.HasPrefix(rec.Header().Get("Location"), "/orders/ord_") {
			t.Fatalf("the form with the API's order: %d\n%s", rec.Code, rec.Body)
		}
		if n := count(t, db, "SELECT COUNT(*) FROM shop_orders"); n != 1 {
			t.Fatalf("%d orders, want 1", n)
		}
		if n, m := stock(t, db, "SKU-1"), stock(t, db, "BOOK-1"); n != 99 || m != 1000 {
			t.Fatalf("stock %d, %d; want 99, 1000", n, m)
		}
	})
}

// Anonymous GETs of / issue no token; a user's GETs keep at most 20
// unused tokens (token.DefaultMaxLive), and the newest still works.
func TestTokensBounded(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, db := webShop(t, b)
		for range 30 {
			if rec := page(s, "GET", "/", 0, nil); rec.Code != http.StatusSeeOther {
				t.Fatalf("GET / without cookie: %d", rec.Code)
			}
		}
		if n := count(t, db, "SELECT COUNT(*) FROM idem_tokens"); n != 0 {
			t.Fatalf("%d tokens after anonymous GETs, want 0", n)
		}
		var last string
		for range 50 {
			last = formToken(t, s, 9)
		}
		for range 30 {
			serve(s, "POST", "/tokens", map[string]string{"X-User-ID": "10"}, "")
		}
		if n := count(t, db, "SELECT COUNT(*) FROM idem_tokens WHERE scope = 'user:9' AND used_at IS NULL"); n > 20 || n < 1 {
			t.Fatalf("%d live tokens of user 9 after 50 pages, want at most 20", n)
		}
		if n := count(t, db, "SELECT COUNT(*) FROM idem_tokens WHERE scope = 'user:10'"); n > 20 {
			t.Fatalf("%d tokens of user 10 after 30 POST /tokens, want at most 20", n)
		}
		form := url.Values{"sku": {"SKU-1"}, "quantity": {"1"}, "token": {last}}
		if rec := page(s, "POST", "/checkout", 9, form); rec.Code != http.StatusSeeOther {
			t.Fatalf("the newest token: %d\n%s", rec.Code, rec.Body)
		}
		if n := count(t, db, "SELECT COUNT(*) FROM shop_orders WHERE user_id = 9"); n != 1 {
			t.Fatalf("%d orders, want 1", n)
		}
	})
}

// The same order spelled another way — the form's fields in another
// order, with spaces, "01" for 1, no coupon field for an empty one, or
// POST /orders with the body's members reordered and spaced — is the
// same request: led to the first order (303, or 409 naming it), not
// refused as another one. One order.
func TestTokenSameOrderSpelledOtherwise(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, db := webShop(t, b)
		tok := formToken(t, s, 11)
		first := page(s, "POST", "/checkout", 11, url.Values{"sku": {"SKU-1"}, "quantity": {"1"}, "coupon_id": {""}, "token": {tok}})
		loc := first.Header().Get("Location")
		if first.Code != http.StatusSeeOther || !strings.HasPrefix(loc, "/orders/ord_") {
			t.Fatalf("first submission: %d\n%s", first.Code, first.Body)
		}
		for _, body := range []string{
			"token=" + tok + "&quantity=1&sku=SKU-1&coupon_id=",
			"sku=+SKU-1+&quantity=01&token=" + tok,
			"coupon_id=%20&quantity=%091&sku=SKU-1&token=" + tok + "&extra=x",
		} {
			req := httptest.NewRequest("POST", "/checkout", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Accept", "text/html")
			req.AddCookie(&http.Cookie{Name: "uid", Value: "11"})
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, req)
			if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != loc {
				t.Errorf("form %q: %d Location %q, want 303 %q\n%s", body, rec.Code, rec.Header().Get("Location"), loc, rec.Body)
			}
		}
		for i, body := range []string{`{"quantity":1,"sku":"SKU-1"}`, ` { "sku" : "SKU-1" , "quantity" : 1 } `} {
			rec := serve(s, "POST", "/orders", map[string]string{"X-User-ID": "11", "Idempotency-Key": fmt.Sprint("spelled-", i), "Submit-Token": tok}, body)
			if rec.Code != http.StatusConflict || rec.Header().Get("Location") != loc {
				t.Errorf("API %s: %d Location %q, want 409 %q\n%s", body, rec.Code, rec.Header().Get("Location"), loc, rec.Body)
			}
		}
		if n := count(t, db, "SELECT COUNT(*) FROM shop_orders"); n != 1 {
			t.Fatalf("%d orders, want 1", n)
		}
	})
}
