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
		`{"sku":null,"quantity":1}`,
		`[1]`,
		``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		sku, qty, err := parseCreateOrder(body)
		if err != nil {
			return
		}
		var lenient struct {
			SKU      string
			Quantity int
		}
		if err := json.Unmarshal(body, &lenient); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", body, err)
		}
		if lenient.SKU != sku || lenient.Quantity != qty {
			t.Fatalf("%q: parsed sku %q quantity %d, encoding/json reads sku %q quantity %d", body, sku, qty, lenient.SKU, lenient.Quantity)
		}
		var members map[string]json.RawMessage
		if err := json.Unmarshal(body, &members); err != nil || len(members) != 2 {
			t.Fatalf("accepted %q with members %v", body, members)
		}
	})
}
