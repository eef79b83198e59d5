package shop

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/idemkit/idem"
)

// Whatever body parseCreateOrder accepts, encoding/json (which matches
// names case-insensitively and lets the last duplicate win) reads the same
// order from it: an accepted body has one meaning.
func FuzzParseCreateOrder(f *testing.F) {
	for _, seed := range []string{
		`{"sku":"A","quantity":1}`,
		`{"quantity":2,"sku":"BOOK-1"}`,
		`{"SKU":"A","quantity":1}`,
		`{"sku":"A","quantity":1,"quantity":5}`,
		`{"sku":"A","quantity":1,"Quantity":5}`,
		`{"sku":"A","s\u006bu":"B","quantity":1}`,
		`{"sku":"A","quantity":1}{}`,
		`{"sku":"A","quantity":1,"coupon_id":1}`,
		`{"sku":"A","quantity":1,"coupon_id":null}`,
		`{"sku":"A","quantity":1,"coupon_id":0}`,
		`{"sku":"A","quantity":1,"Coupon_id":1}`,
		`{"sku":null,"quantity":1}`,
		`[1]`,
		``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := parseCreateOrder(body)
		if err != nil {
			return
		}
		sku, qty := req.SKU, req.Quantity
		var lenient struct {
			SKU      string
			Quantity int
			CouponID *int64 `json:"coupon_id"`
		}
		if err := json.Unmarshal(body, &lenient); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", body, err)
		}
		if lenient.SKU != sku || lenient.Quantity != qty {
			t.Fatalf("%q: parsed sku %q quantity %d, encoding/json reads sku %q quantity %d", body, sku, qty, lenient.SKU, lenient.Quantity)
		}
		if coupon := lenient.CouponID; (coupon == nil && req.CouponID != 0) || (coupon != nil && *coupon != req.CouponID) {
			t.Fatalf("%q: parsed coupon %d, encoding/json reads %v", body, req.CouponID, coupon)
		}
		var members map[string]json.RawMessage
		if err := json.Unmarshal(body, &members); err != nil || len(members) < 2 || len(members) > 3 {
			t.Fatalf("accepted %q with members %v", body, members)
		}
	})
}

// FuzzParsePaymentCallback: whatever callback body is accepted,
// encoding/json reads the same callback from it (one meaning), each field
// matches its pattern, and its idempotency key is a valid key that no
// other accepted callback shares: two callbacks with one key are the same
// callback, so a repeat replays and anything else reaches the guards.
func FuzzParsePaymentCallback(f *testing.F) {
	for _, s := range [][2]string{
		{`{"order_no":"o-1","trade_no":"T1","amount_cents":500,"status":"SUCCESS"}`, `{"status":"SUCCESS","amount_cents":500,"trade_no":"T1","order_no":"o-1"}`},
		{`{"order_no":"o","trade_no":"a:b","amount_cents":1,"status":"X"}`, `{"order_no":"o","trade_no":"a","amount_cents":1,"status":"B:X"}`},
		{`{"order_no":"o","trade_no":"t","amount_cents":1,"status":"S","status":"F"}`, `{"Order_no":"o","trade_no":"t","amount_cents":1,"status":"S"}`},
		{`{"order_no":"o","trade_no":"t","amount_cents":1.0,"status":"S"}`, `{"order_no":"o","trade_no":"t","amount_cents":-0,"status":"S"}`},
		{`{"order_no":null,"trade_no":"t","amount_cents":1,"status":"S"}`, `[]`},
	} {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, body, other []byte) {
		cb, err := parsePaymentCallback(body)
		if err != nil {
			return
		}
		var lenient paymentCallback
		if err := json.Unmarshal(body, &lenient); err != nil || lenient != cb {
			t.Fatalf("accepted %q as %+v; encoding/json reads %+v, %v", body, cb, lenient, err)
		}
		if !orderNoPattern.MatchString(cb.OrderNo) || !tradeNoPattern.MatchString(cb.TradeNo) ||
			!payStatusPattern.MatchString(cb.Status) || cb.AmountCents < 0 {
			t.Fatalf("accepted %q as %+v", body, cb)
		}
		key := paymentKey(cb)
		if err := idem.ValidateKey(key); err != nil {
			t.Fatalf("%+v: key %q: %v", cb, key, err)
		}
		cb2, err := parsePaymentCallback(other)
		if err == nil && paymentKey(cb2) == key && cb2 != cb {
			t.Fatalf("%+v and %+v share the key %q", cb, cb2, key)
		}
	})
}

// FuzzParseBroker: -broker is accepted as the embedded server (empty),
// NATS (nats://, tls://) or RabbitMQ (amqp://, amqps://) with a host, and
// refused otherwise; neither what is shown of it nor its error shows the
// password of its user info.
func FuzzParseBroker(f *testing.F) {
	for _, s := range []string{"", "nats://127.0.0.1:4222", "tls://n:4222", "amqp://guest:s3cretpw@127.0.0.1:5672/", "amqps://u:s3cretpw@h/v",
		"http://h", "amqp://u:s3cr\"etpw@h:x/", "nats://", "amqp://u:s3cretpw@/v"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		b, err := parseBroker(raw)
		u, perr := url.Parse(raw)
		wantKind := ""
		switch {
		case raw == "":
			wantKind = "embedded"
		case perr != nil || u.Host == "":
		case u.Scheme == "nats" || u.Scheme == "tls":
			wantKind = "nats"
		case u.Scheme == "amqp" || u.Scheme == "amqps":
			wantKind = "amqp"
		}
		if (err == nil) != (wantKind != "") || err == nil && (b.kind != wantKind || raw != "" && b.url != raw) {
			t.Fatalf("parseBroker(%q) = %+v, %v; want kind %q", raw, b, err, wantKind)
		}
		if perr != nil || u.User == nil {
			return
		}
		pw, ok := u.User.Password()
		shown := b.display
		if err != nil {
			shown = err.Error()
		}
		if ok && len(pw) >= 6 && strings.Contains(shown, pw) && strings.Count(raw, pw) == 1 {
			t.Fatalf("parseBroker(%q) shows the password %q: %s", raw, pw, shown)
		}
	})
}

// FuzzCheckoutForm: whatever checkout form is accepted holds a valid SKU,
// a quantity from 1 to MaxQuantity, a coupon (0 for none) and a token;
// the same order sent as JSON to POST /orders parses to the same request
// with the same canonical form (the fingerprint of its submit token), and
// two orders share a canonical form only when they are the same order.
func FuzzCheckoutForm(f *testing.F) {
	for _, s := range []string{"sku=BOOK-1&quantity=2&token=t", "sku=A&quantity=1&coupon_id=7&token=t", "sku=A&sku=B&quantity=1&token=t",
		"sku=+A+&quantity=01&token=t", "sku=A&quantity=1&coupon_id=0&token=t", "sku=A&quantity=1&coupon_id=&token=%20", "sku=A;quantity=1"} {
		f.Add(s, "sku=A&quantity=1&token=t")
	}
	f.Fuzz(func(t *testing.T, form, other string) {
		parse := func(form string) (orderRequest, string, error) {
			r := httptest.NewRequest(http.MethodPost, "/checkout", strings.NewReader(form))
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			return checkoutForm(r)
		}
		req, tok, err := parse(form)
		if err != nil {
			return
		}
		if checkSKU(req.SKU) != nil || req.Quantity < 1 || req.Quantity > MaxQuantity || req.CouponID < 0 || tok == "" {
			t.Fatalf("accepted %q as %+v, token %q", form, req, tok)
		}
		body, _ := json.Marshal(map[string]any{"sku": req.SKU, "quantity": req.Quantity})
		if req.CouponID != 0 {
			body, _ = json.Marshal(map[string]any{"sku": req.SKU, "quantity": req.Quantity, "coupon_id": req.CouponID})
		}
		asJSON, err := parseCreateOrder(body)
		if err != nil || asJSON != req || !bytes.Equal(asJSON.canonical(), req.canonical()) {
			t.Fatalf("form %q is %+v; as JSON %s it is %+v, %v", form, req, body, asJSON, err)
		}
		req2, _, err := parse(other)
		if err == nil && bytes.Equal(req2.canonical(), req.canonical()) != (req2 == req) {
			t.Fatalf("%+v and %+v: canonical forms %q and %q", req, req2, req.canonical(), req2.canonical())
		}
	})
}
