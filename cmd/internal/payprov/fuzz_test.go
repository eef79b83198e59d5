package payprov

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"testing"
)

// FuzzDecode checks that decode never panics and that a body it accepts
// has the fingerprint of its own re-encoding, so that a replay of an
// accepted request is never taken for another request.
func FuzzDecode(f *testing.F) {
	f.Add(0, []byte(`{"payment":"pay_1","amount_cents":1299,"currency":"EUR","reason":"r"}`))
	f.Add(1, []byte(`{"amount_cents":1,"currency":"EUR","source":"tok_visa"}`))
	f.Add(2, []byte(`{"order":"o1","address":"a"}`))
	f.Add(0, []byte(`{"payment":"p","amount_cents":1e3,"currency":"EUR"} {}`))
	f.Fuzz(func(t *testing.T, which int, body []byte) {
		res := resources[uint(which)%uint(len(resources))]
		req, fp, err := decode(httptest.NewRequest("POST", res.path, bytes.NewReader(body)), httptest.NewRecorder(), res)
		if err != nil {
			return
		}
		canon, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		_, again, err := decode(httptest.NewRequest("POST", res.path, bytes.NewReader(canon)), httptest.NewRecorder(), res)
		if err != nil || again != fp {
			t.Fatalf("%s accepted, its re-encoding %s: %v, fingerprint %q; want %q", body, canon, err, again, fp)
		}
	})
}
