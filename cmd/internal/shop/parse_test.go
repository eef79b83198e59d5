package shop

import (
	"encoding/json"
	"testing"
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
