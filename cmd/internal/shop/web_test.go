package shop_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/shop"
)

// webShop is a shop with the default catalogue.
func webShop(t *testing.T, b backend) (*shop.Shop, *sql.DB) {
	t.Helper()
	return newShop(t, b)
}

// page sends a browser's request: the uid cookie (if uid > 0), Accept
// text/html, and for a POST the form.
func page(s http.Handler, method, target string, uid int64, form url.Values) *httptest.ResponseRecorder {
	var req *http.Request
	if method == http.MethodPost {
		req = httptest.NewRequest(method, target, strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	} else {
		req = httptest.NewRequest(method, target, nil)
	}
	req.Header.Set("Accept", "text/html,application/xhtml+xml,*/*;q=0.8")
	if uid > 0 {
		req.AddCookie(&http.Cookie{Name: "uid", Value: fmt.Sprint(uid)})
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	return rec
}

var tokenField = regexp.MustCompile(`name="token" value="([A-Za-z0-9_-]+)"`)

// formToken renders the checkout page for uid and returns its token.
func formToken(t *testing.T, s http.Handler, uid int64) string {
	t.Helper()
	rec := page(s, "GET", "/", uid, nil)
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /: %d %s", rec.Code, rec.Body)
	}
	m := tokenField.FindStringSubmatch(rec.Body.String())
	if m == nil {
		t.Fatalf("no token field in the checkout page:\n%s", rec.Body)
	}
	return m[1]
}

// count runs a COUNT(*) query (values written in the query, no
// placeholders, so it runs on every dialect).
func count(t *testing.T, db *sql.DB, query string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func stock(t *testing.T, db *sql.DB, sku string) int {
	t.Helper()
	return count(t, db, "SELECT stock FROM shop_products WHERE sku = '"+sku+"'")
}

// The checkout form posted twice with its token (a double click with
// scripts off, a resubmitted form): both answers are 303 to the same
// order page, and there is one order and one stock reservation.
func TestCheckoutDoubleSubmitWithoutScripts(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, db := webShop(t, b)
		tok := formToken(t, s, 3)
		form := url.Values{"sku": {"SKU-1"}, "quantity": {"2"}, "coupon_id": {""}, "token": {tok}}
		first := page(s, "POST", "/checkout", 3, form)
		second := page(s, "POST", "/checkout", 3, form)
		loc := first.Header().Get("Location")
		if first.Code != http.StatusSeeOther || !strings.HasPrefix(loc, "/orders/ord_") {
			t.Fatalf("first submission: %d Location %q: %s", first.Code, loc, first.Body)
		}
		if second.Code != http.StatusSeeOther || second.Header().Get("Location") != loc {
			t.Fatalf("second submission: %d Location %q, want 303 %q", second.Code, second.Header().Get("Location"), loc)
		}
		// The same token with another quantity (back, edit, resubmit):
		// another order, refused with a page that says so; not led to
		// the first order, and nothing created.
		form.Set("quantity", "5")
		if third := page(s, "POST", "/checkout", 3, form); third.Code != http.StatusUnprocessableEntity ||
			!strings.Contains(third.Body.String(), "already sent for a different order") || !strings.Contains(third.Body.String(), `href="/"`) {
			t.Fatalf("edited resubmission: %d Location %q, want 422 and a page\n%s", third.Code, third.Header().Get("Location"), third.Body)
		}
		no := strings.TrimPrefix(loc, "/orders/")
		if n := count(t, db, "SELECT COUNT(*) FROM shop_orders"); n != 1 {
			t.Fatalf("%d orders, want 1", n)
		}
		if n := count(t, db, "SELECT quantity FROM shop_orders WHERE order_no = '"+no+"' AND user_id = 3"); n != 2 {
			t.Fatalf("order quantity %d, want 2", n)
		}
		if n := stock(t, db, "SKU-1"); n != 98 {
			t.Fatalf("stock %d, want 98", n)
		}
		// The 303's target is the order's page.
		rec := page(s, "GET", loc, 3, nil)
		if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") ||
			!strings.Contains(rec.Body.String(), no) || !strings.Contains(rec.Body.String(), "WAIT_PAY") {
			t.Fatalf("order page: %d %q\n%s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
		}
	})
}

// A refused checkout (out of stock) rolls back with the token unspent:
// the corrected form, same token, creates the order.
func TestCheckoutRefusalKeepsToken(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, db := webShop(t, b)
		tok := formToken(t, s, 4)
		form := url.Values{"sku": {"SKU-1"}, "quantity": {"101"}, "token": {tok}}
		rec := page(s, "POST", "/checkout", 4, form)
		if rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), "Out of stock") ||
			!strings.Contains(rec.Body.String(), `href="/"`) {
			t.Fatalf("out of stock: %d\n%s", rec.Code, rec.Body)
		}
		if n := count(t, db, "SELECT COUNT(*) FROM shop_orders"); n != 0 {
			t.Fatalf("%d orders after a refusal, want 0", n)
		}
		if got, want := tokenRows(t, db), []tokenRow{{}}; !slices.Equal(got, want) {
			t.Fatalf("token rows after a refusal %+v, want %+v (unspent)", got, want)
		}
		form.Set("quantity", "1")
		rec = page(s, "POST", "/checkout", 4, form)
		if rec.Code != http.StatusSeeOther {
			t.Fatalf("corrected form: %d\n%s", rec.Code, rec.Body)
		}
		if got, want := tokenRows(t, db), []tokenRow{{true, strings.TrimPrefix(rec.Header().Get("Location"), "/orders/")}}; !slices.Equal(got, want) {
			t.Fatalf("token rows %+v, want %+v", got, want)
		}
		if n := count(t, db, "SELECT COUNT(*) FROM shop_orders WHERE user_id = 4 AND quantity = 1"); n != 1 {
			t.Fatalf("%d orders, want 1", n)
		}
		if n := stock(t, db, "SKU-1"); n != 99 {
			t.Fatalf("stock %d, want 99", n)
		}
	})
}

// Refusals of the checkout form are readable pages with a link back, and
// create nothing.
func TestCheckoutRefusals(t *testing.T) {
	t.Parallel()
	s, db := webShop(t, sqliteBackend)
	tok := formToken(t, s, 5)
	valid := func(mod func(url.Values)) url.Values {
		v := url.Values{"sku": {"SKU-1"}, "quantity": {"1"}, "token": {tok}}
		if mod != nil {
			mod(v)
		}
		return v
	}
	cases := []struct {
		name   string
		uid    int64
		form   url.Values
		header map[string]string
		status int
		text   string
	}{
		{"no cookie", 0, valid(nil), nil, 401, "Not signed in"},
		{"cross-site", 5, valid(nil), map[string]string{"Sec-Fetch-Site": "cross-site"}, 403, "another site"},
		{"foreign origin", 5, valid(nil), map[string]string{"Origin": "https://evil.example"}, 403, "another site"},
		{"unknown token", 5, valid(func(v url.Values) { v.Set("token", "AAAAAAAAAAAAAAAAAAAAAA") }), nil, 400, "Invalid submit token"},
		{"malformed token", 5, valid(func(v url.Values) { v.Set("token", "<x>") }), nil, 400, "Invalid submit token"},
		{"no token", 5, valid(func(v url.Values) { v.Del("token") }), nil, 400, "no submit token"},
		{"another user's token", 6, valid(nil), nil, 400, "Invalid submit token"},
		{"quantity zero", 5, valid(func(v url.Values) { v.Set("quantity", "0") }), nil, 400, "quantity must be"},
		{"quantity text", 5, valid(func(v url.Values) { v.Set("quantity", "two") }), nil, 400, "quantity must be"},
		{"two quantities", 5, valid(func(v url.Values) { v.Add("quantity", "2") }), nil, 400, "more than once"},
		{"bad sku", 5, valid(func(v url.Values) { v.Set("sku", "<script>") }), nil, 400, "sku must be"},
		{"unknown sku", 5, valid(func(v url.Values) { v.Set("sku", "NOPE") }), nil, 400, "Unknown SKU"},
		{"coupon not claimed", 5, valid(func(v url.Values) { v.Set("coupon_id", "1") }), nil, 409, "Coupon not usable"},
		{"bad coupon", 5, valid(func(v url.Values) { v.Set("coupon_id", "-1") }), nil, 400, "coupon_id must be"},
	}
	for _, c := range cases {
		req := httptest.NewRequest("POST", "/checkout", strings.NewReader(c.form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Host = "shop.test"
		for k, v := range c.header {
			req.Header.Set(k, v)
		}
		if c.uid > 0 {
			req.AddCookie(&http.Cookie{Name: "uid", Value: fmt.Sprint(c.uid)})
		}
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		body := rec.Body.String()
		if rec.Code != c.status || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") ||
			!strings.Contains(body, c.text) || !strings.Contains(body, `id="back"`) {
			t.Errorf("%s: %d %q, want %d page saying %q:\n%s", c.name, rec.Code, rec.Header().Get("Content-Type"), c.status, c.text, body)
		}
		if strings.Contains(body, "<script>") {
			t.Errorf("%s: the page holds an unescaped <script>", c.name)
		}
	}
	if n := count(t, db, "SELECT COUNT(*) FROM shop_orders"); n != 0 {
		t.Fatalf("%d orders after refusals, want 0", n)
	}
	// None of the refusals spent the token.
	if rec := page(s, "POST", "/checkout", 5, valid(nil)); rec.Code != http.StatusSeeOther {
		t.Fatalf("the token after the refusals: %d\n%s", rec.Code, rec.Body)
	}
}

// The page identity: a visitor without the cookie is user 1 and gets a
// SameSite=Lax, HttpOnly cookie, with a 303 back to /?signed_in=1 (the
// page comes with the cookie); /?uid=N signs in as N.
func TestPageIdentity(t *testing.T) {
	t.Parallel()
	s, _ := webShop(t, sqliteBackend)
	rec := page(s, "GET", "/", 0, nil)
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/?signed_in=1" {
		t.Fatalf("GET / without cookie: %d\n%s", rec.Code, rec.Body)
	}
	c := cookie(rec, "uid")
	if c == nil || c.Value != "1" || c.SameSite != http.SameSiteLaxMode || !c.HttpOnly || c.Path != "/" {
		t.Fatalf("cookie %+v", c)
	}
	if rec := page(s, "GET", "/?signed_in=1", 1, nil); rec.Code != 200 || !strings.Contains(rec.Body.String(), "user 1") {
		t.Fatalf("GET / with the cookie it got: %d\n%s", rec.Code, rec.Body)
	}
	rec = page(s, "GET", "/?uid=9", 0, nil)
	if c := cookie(rec, "uid"); rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/?signed_in=1" || c == nil || c.Value != "9" {
		t.Fatalf("/?uid=9: %d Location %q cookie %+v", rec.Code, rec.Header().Get("Location"), c)
	}
	if rec := page(s, "GET", "/", 9, nil); !strings.Contains(rec.Body.String(), "user 9") || cookie(rec, "uid") != nil {
		t.Fatalf("GET / as 9: %d\n%s", rec.Code, rec.Body)
	}
	for _, bad := range []string{"0", "-2", "abc", "01", "%3Cb%3E"} {
		rec := page(s, "GET", "/?uid="+bad, 0, nil)
		if rec.Code != http.StatusBadRequest || cookie(rec, "uid") != nil || strings.Contains(rec.Body.String(), "<b>") {
			t.Errorf("/?uid=%s: %d %+v", bad, rec.Code, cookie(rec, "uid"))
		}
	}
	// The page's assets are served from the binary.
	for _, p := range []string{"/static/app.js", "/static/style.css"} {
		if rec := serve(s, "GET", p, nil, ""); rec.Code != 200 || rec.Body.Len() == 0 {
			t.Errorf("%s: %d", p, rec.Code)
		}
	}
}

func cookie(rec *httptest.ResponseRecorder, name string) *http.Cookie {
	for _, c := range rec.Result().Cookies() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// html/template escapes what the page shows: a product name with markup
// appears as text.
func TestCheckoutPageEscapes(t *testing.T) {
	t.Parallel()
	s, _ := newShopWith(t, sqliteBackend, shop.Catalog{Products: []shop.Product{{SKU: "X-1", Name: `<img src=x onerror="alert(1)"> & co`, PriceCents: 5, Stock: 1}}})
	body := page(s, "GET", "/", 1, nil).Body.String()
	if strings.Contains(body, "<img") || !strings.Contains(body, "&lt;img src=x onerror=&#34;alert(1)&#34;&gt; &amp; co") {
		t.Fatalf("product name not escaped:\n%s", body)
	}
	if !strings.Contains(body, "0.05") {
		t.Fatalf("price 5 cents not shown as 0.05:\n%s", body)
	}
}

// GET /orders/{order_no} answers a browser (no X-User-ID, Accept
// text/html) with the page and an API client with JSON; the page's Pay
// and Cancel are form posts answered with 303 back to the page.
func TestOrderPageActions(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, db := webShop(t, b)
		checkout := func(qty string) string {
			rec := page(s, "POST", "/checkout", 7, url.Values{"sku": {"BOOK-1"}, "quantity": {qty}, "token": {formToken(t, s, 7)}})
			if rec.Code != http.StatusSeeOther {
				t.Fatalf("checkout: %d\n%s", rec.Code, rec.Body)
			}
			return strings.TrimPrefix(rec.Header().Get("Location"), "/orders/")
		}
		paid, cancelled := checkout("1"), checkout("3")

		// The API keeps JSON, also when it asks for HTML with X-User-ID.
		for _, accept := range []string{"", "application/json", "text/html"} {
			rec := serve(s, "GET", "/orders/"+paid, map[string]string{"X-User-ID": "7", "Accept": accept}, "")
			var o shop.Order
			if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &o) != nil || o.OrderNo != paid {
				t.Fatalf("API GET with Accept %q: %d %s", accept, rec.Code, rec.Body)
			}
		}
		// Another user's order is a 404 page.
		if rec := page(s, "GET", "/orders/"+paid, 8, nil); rec.Code != 404 || !strings.Contains(rec.Body.String(), "No such order") {
			t.Fatalf("another user's order page: %d\n%s", rec.Code, rec.Body)
		}
		if rec := page(s, "POST", "/orders/"+paid+"/pay", 8, url.Values{}); rec.Code != 404 {
			t.Fatalf("paying another user's order: %d\n%s", rec.Code, rec.Body)
		}
		// The simulated payment is a page action: the API has no such resource.
		if rec := serve(s, "POST", "/orders/"+paid+"/pay", map[string]string{"X-User-ID": "7"}, ""); rec.Code != 404 || problemCode(t, rec) != "NOT_FOUND" {
			t.Fatalf("API pay: %d %s", rec.Code, rec.Body)
		}

		for i := range 2 { // paying twice pays once
			rec := page(s, "POST", "/orders/"+paid+"/pay", 7, url.Values{})
			if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/orders/"+paid {
				t.Fatalf("pay #%d: %d %q\n%s", i+1, rec.Code, rec.Header().Get("Location"), rec.Body)
			}
		}
		if n := count(t, db, "SELECT COUNT(*) FROM shop_payments WHERE order_no = '"+paid+"'"); n != 1 {
			t.Fatalf("%d payments, want 1", n)
		}
		// The payment came through the signed callback (its trade number
		// is derived from the order and the secret), which the
		// idempotency middleware recorded under the provider's scope.
		var trade string
		if err := db.QueryRow("SELECT trade_no FROM shop_payments WHERE order_no = '" + paid + "'").Scan(&trade); err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`^sim_[0-9a-f]{24}$`).MatchString(trade) {
			t.Fatalf("trade_no %q, want the simulated trade sim_<24 hex>", trade)
		}
		if n := count(t, db, "SELECT COUNT(*) FROM idem_records WHERE scope = 'provider:pay'"); n != 1 {
			t.Fatalf("%d idempotency records of the payment callback, want 1 (one trade, three callbacks, paid twice)", n)
		}
		if rec := page(s, "GET", "/orders/"+paid, 7, nil); !strings.Contains(rec.Body.String(), ">PAID<") || strings.Contains(rec.Body.String(), `id="pay"`) {
			t.Fatalf("paid order's page:\n%s", rec.Body)
		}
		if rec := page(s, "POST", "/orders/"+paid+"/cancel", 7, url.Values{}); rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), "not cancellable") {
			t.Fatalf("cancel a paid order: %d\n%s", rec.Code, rec.Body)
		}

		before := stock(t, db, "BOOK-1")
		for i := range 2 { // cancelling twice gives the stock back once
			if rec := page(s, "POST", "/orders/"+cancelled+"/cancel", 7, url.Values{}); rec.Code != http.StatusSeeOther {
				t.Fatalf("cancel #%d: %d\n%s", i+1, rec.Code, rec.Body)
			}
		}
		if n := count(t, db, "SELECT COUNT(*) FROM shop_orders WHERE order_no = '"+cancelled+"' AND status = 'CANCELLED'"); n != 1 {
			t.Fatalf("order not cancelled")
		}
		if n := stock(t, db, "BOOK-1"); n != before+3 {
			t.Fatalf("stock %d after cancelling 3, want %d", n, before+3)
		}
		if rec := page(s, "POST", "/orders/"+cancelled+"/pay", 7, url.Values{}); rec.Code != http.StatusConflict {
			t.Fatalf("pay a cancelled order: %d\n%s", rec.Code, rec.Body)
		}
		if n := count(t, db, "SELECT COUNT(*) FROM shop_payments"); n != 1 {
			t.Fatalf("%d payments, want 1", n)
		}
	})
}

// POST /tokens issues a token to the caller; POST /orders spends one
// given in Submit-Token. The same Idempotency-Key replays its 201 (the
// key is checked before the token); another key with a used token is 409
// DUPLICATE_SUBMISSION naming the order; an unknown token, or another
// user's, is 400 INVALID_TOKEN.
func TestSubmitTokensAPI(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, db := webShop(t, b)
		issue := func(user string) string {
			rec := serve(s, "POST", "/tokens", map[string]string{"X-User-ID": user}, "")
			var tr struct{ Token, Expires_At string }
			if rec.Code != http.StatusCreated || json.Unmarshal(rec.Body.Bytes(), &tr) != nil || len(tr.Token) != 22 {
				t.Fatalf("POST /tokens: %d %s", rec.Code, rec.Body)
			}
			exp, err := time.Parse(time.RFC3339, tr.Expires_At)
			if err != nil || time.Until(exp) < 29*time.Minute || time.Until(exp) > 31*time.Minute {
				t.Fatalf("expires_at %q (%v), want about 30 min from now", tr.Expires_At, err)
			}
			return tr.Token
		}
		if rec := serve(s, "POST", "/tokens", nil, ""); rec.Code != 401 || problemCode(t, rec) != "UNAUTHENTICATED" {
			t.Fatalf("POST /tokens without a user: %d %s", rec.Code, rec.Body)
		}
		tok := issue("11")
		order := func(key, token, user string) *httptest.ResponseRecorder {
			h := map[string]string{"X-User-ID": user, "Idempotency-Key": key}
			if token != "" {
				h["Submit-Token"] = token
			}
			return serve(s, "POST", "/orders", h, `{"sku":"SKU-1","quantity":1}`)
		}
		first := order("k1", tok, "11")
		var o shop.Order
		if first.Code != http.StatusCreated || json.Unmarshal(first.Body.Bytes(), &o) != nil {
			t.Fatalf("first: %d %s", first.Code, first.Body)
		}
		if rec := order("k1", tok, "11"); rec.Code != http.StatusCreated || rec.Header().Get("Idempotent-Replayed") != "true" || rec.Body.String() != first.Body.String() {
			t.Fatalf("same key: %d replayed=%q %s", rec.Code, rec.Header().Get("Idempotent-Replayed"), rec.Body)
		}
		rec := order("k2", tok, "11")
		var dup struct {
			OrderNo string `json:"order_no"`
		}
		p := problemOf(t, rec)
		json.Unmarshal(rec.Body.Bytes(), &dup)
		if rec.Code != http.StatusConflict || p.Code != "DUPLICATE_SUBMISSION" || dup.OrderNo != o.OrderNo || rec.Header().Get("Location") != "/orders/"+o.OrderNo {
			t.Fatalf("another key: %d Location %q %s", rec.Code, rec.Header().Get("Location"), rec.Body)
		}
		for name, c := range map[string][2]string{
			"unknown":   {"AAAAAAAAAAAAAAAAAAAAAA", "11"},
			"malformed": {"not a token", "11"},
			"foreign":   {issue("12"), "11"},
		} {
			if rec := order("k-"+name, c[0], c[1]); rec.Code != http.StatusBadRequest || problemCode(t, rec) != "INVALID_TOKEN" {
				t.Errorf("%s token: %d %s", name, rec.Code, rec.Body)
			}
		}
		two := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"sku":"SKU-1","quantity":1}`))
		two.Header.Set("X-User-ID", "11")
		two.Header.Set("Idempotency-Key", "k-two")
		two.Header.Add("Submit-Token", tok)
		two.Header.Add("Submit-Token", issue("11"))
		rec = httptest.NewRecorder()
		s.ServeHTTP(rec, two)
		if rec.Code != 400 || problemCode(t, rec) != "INVALID_REQUEST" {
			t.Errorf("two Submit-Token fields: %d %s", rec.Code, rec.Body)
		}
		if n := count(t, db, "SELECT COUNT(*) FROM shop_orders"); n != 1 {
			t.Fatalf("%d orders, want 1", n)
		}
		// Without Submit-Token, POST /orders works as before.
		if rec := order("k3", "", "11"); rec.Code != http.StatusCreated {
			t.Fatalf("no token: %d %s", rec.Code, rec.Body)
		}
	})
}

// Concurrent submissions of one token: one order, every answer the same
// 303.
func TestCheckoutConcurrentSubmissions(t *testing.T) {
	forIsolations(t, func(t *testing.T, b backend) {
		// SQLite runs one transaction at a time; on the servers the token
		// spent in the order's transaction (sqlstore's TokenStore) makes
		// the other submissions wait for the first, then see it used.
		s, db := webShop(t, b)
		tok := formToken(t, s, 13)
		form := url.Values{"sku": {"SKU-1"}, "quantity": {"1"}, "token": {tok}}
		const n = 12
		locs := make([]string, n)
		codes := make([]int, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				rec := page(s, "POST", "/checkout", 13, form)
				codes[i], locs[i] = rec.Code, rec.Header().Get("Location")
			})
		}
		close(start)
		wg.Wait()
		for i := range n {
			if codes[i] != http.StatusSeeOther || locs[i] != locs[0] || locs[0] == "" {
				t.Fatalf("submission %d: %d %q; the first: %d %q", i, codes[i], locs[i], codes[0], locs[0])
			}
		}
		if got := count(t, db, "SELECT COUNT(*) FROM shop_orders"); got != 1 {
			t.Fatalf("%d orders, want 1", got)
		}
		if got := stock(t, db, "SKU-1"); got != 99 {
			t.Fatalf("stock %d, want 99", got)
		}
		if got, want := tokenRows(t, db), []tokenRow{{used: true, result: strings.TrimPrefix(locs[0], "/orders/")}}; !slices.Equal(got, want) {
			t.Fatalf("token rows %+v, want %+v", got, want)
		}
	})
}

// tokenRow is a row of idem_tokens, the submit tokens' table.
type tokenRow struct {
	used   bool
	result string
}

// tokenRows reads idem_tokens: whether each token was spent, and the
// order its use attached.
func tokenRows(t *testing.T, db *sql.DB) []tokenRow {
	t.Helper()
	rows, err := db.Query(`SELECT used_at, result FROM idem_tokens ORDER BY created_at, digest`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []tokenRow
	for rows.Next() {
		var used sql.NullInt64
		var result []byte
		if err := rows.Scan(&used, &result); err != nil {
			t.Fatal(err)
		}
		out = append(out, tokenRow{used.Valid, string(result)})
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// The submit-token codes are documented like the others.
func TestSubmitTokenProblemsDocumented(t *testing.T) {
	t.Parallel()
	s, _ := webShop(t, sqliteBackend)
	rec := serve(s, "POST", "/orders", map[string]string{"X-User-ID": "1", "Idempotency-Key": "a", "Submit-Token": "AAAAAAAAAAAAAAAAAAAAAA"}, `{"sku":"SKU-1","quantity":1}`)
	checkDocumented(t, rec, "INVALID_TOKEN")
	tok := serve(s, "POST", "/tokens", map[string]string{"X-User-ID": "1"}, "")
	var tr struct{ Token string }
	json.Unmarshal(tok.Body.Bytes(), &tr)
	serve(s, "POST", "/orders", map[string]string{"X-User-ID": "1", "Idempotency-Key": "b", "Submit-Token": tr.Token}, `{"sku":"SKU-1","quantity":1}`)
	rec = serve(s, "POST", "/orders", map[string]string{"X-User-ID": "1", "Idempotency-Key": "c", "Submit-Token": tr.Token}, `{"sku":"SKU-1","quantity":1}`)
	checkDocumented(t, rec, "DUPLICATE_SUBMISSION")
}

// checkDocumented checks that rec is the problem code, typed with the
// address of its section in PROBLEMS.md, which says `<status> <code>`.
func checkDocumented(t *testing.T, rec *httptest.ResponseRecorder, code string) {
	t.Helper()
	p := problemOf(t, rec)
	if p.Code != code {
		t.Fatalf("answer meant to be %s is %d %s", code, rec.Code, rec.Body)
	}
	if want := "https://github.com/idemkit/idem/blob/main/cmd/internal/shop/PROBLEMS.md#" + strings.ToLower(code); p.Type != want {
		t.Errorf("%s: type %q, want %q", code, p.Type, want)
	}
	doc, err := os.ReadFile("PROBLEMS.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "\n## "+strings.ToLower(code)+"\n") || !strings.Contains(string(doc), fmt.Sprintf("`%d %s`", rec.Code, code)) {
		t.Errorf("PROBLEMS.md has no section %q saying `%d %s`", strings.ToLower(code), rec.Code, code)
	}
}

// A Pay click whose browser goes away at once (a double click without
// scripts aborts the first post) still pays: the simulated provider's
// callbacks do not end with the page's request, as a real provider's do
// not. Before, they were cancelled halfway, and the execution they left
// in flight made the next click's callbacks wait and answer 409.
func TestPayPageOutlivesItsRequest(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, db := webShop(t, b)
		rec := page(s, "POST", "/checkout", 9, url.Values{"sku": {"SKU-1"}, "quantity": {"1"}, "token": {formToken(t, s, 9)}})
		no := strings.TrimPrefix(rec.Header().Get("Location"), "/orders/")
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // the browser left before the shop answered
		req := httptest.NewRequestWithContext(ctx, "POST", "/orders/"+no+"/pay", strings.NewReader(""))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(&http.Cookie{Name: "uid", Value: "9"})
		s.ServeHTTP(httptest.NewRecorder(), req)
		if n := count(t, db, "SELECT COUNT(*) FROM shop_orders WHERE order_no = '"+no+"' AND status = 'PAID'"); n != 1 {
			t.Fatalf("the order is not paid after a Pay whose browser left")
		}
		if rec := page(s, "POST", "/orders/"+no+"/pay", 9, url.Values{}); rec.Code != http.StatusSeeOther {
			t.Fatalf("pay again: %d\n%s", rec.Code, rec.Body)
		}
		if n := count(t, db, "SELECT COUNT(*) FROM shop_payments WHERE order_no = '"+no+"'"); n != 1 {
			t.Fatalf("%d payments, want 1", n)
		}
	})
}
