package idem_test

import (
	"errors"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/idemkit/idem"
)

// FuzzOutcome: whatever a record holds, DecodeOutcome answers a result or
// an error without panicking, and a DefiniteError it returns has a code.
// What EncodeOutcome stores for a result or a definite error decodes back
// to the same.
func FuzzOutcome(f *testing.F) {
	f.Add(200, []byte(`{"a":1}`), "", "")
	f.Add(422, []byte(`{"code":"declined","message":"card declined"}`), "declined", "card declined")
	f.Add(422, []byte(`{"code":""}`), "x", "")
	f.Add(500, []byte(nil), "", "")
	f.Fuzz(func(t *testing.T, status int, body []byte, code, msg string) {
		type result struct {
			A int    `json:"a"`
			B string `json:"b"`
		}
		c := idem.JSONCodec[result]{}
		_, err := idem.DecodeOutcome[result](c, idem.Response{StatusCode: status, Body: body}, true)
		var de *idem.DefiniteError
		if errors.As(err, &de) && (de.Code == "" || !de.Replayed) {
			t.Fatalf("decoded a definite error without a code, or not replayed: %+v", de)
		}
		// Round trips.
		in := result{A: status, B: string(body)}
		resp, answer, store := idem.EncodeOutcome[result](c, in, nil)
		if !store || answer != nil {
			t.Fatalf("a result: store %v, answer %v", store, answer)
		}
		out, err := idem.DecodeOutcome[result](c, resp, false)
		if err != nil {
			t.Fatalf("decode the stored result: %v", err)
		}
		// encoding/json replaces invalid UTF-8: valid text round trips.
		if utf8.Valid(body) && !reflect.DeepEqual(out, in) {
			t.Fatalf("stored %+v, read back %+v", in, out)
		}
		if code == "" || !utf8.ValidString(code) {
			_, _, store := idem.EncodeOutcome[result](c, result{}, &idem.DefiniteError{Code: code})
			if store {
				t.Fatalf("a definite error with code %q was stored: it would not read back the same", code)
			}
			return
		}
		def := &idem.DefiniteError{Code: code, Message: msg}
		resp, answer, store = idem.EncodeOutcome[result](c, result{}, def)
		if !store || !errors.Is(answer, def) {
			t.Fatalf("a definite error: store %v, answer %v", store, answer)
		}
		_, err = idem.DecodeOutcome[result](c, resp, true)
		if !errors.As(err, &de) || de.Code != code || !de.Replayed {
			t.Fatalf("decode the stored definite error %q: %v", code, err)
		}
	})
}
