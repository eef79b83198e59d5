package idemhttp_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{" {\n\t\"b\" : [ 1 , 2 ] ,\r\n \"a\" : { } } ", `{"a":{},"b":[1,2]}`},
		{`{"b":{"d":1,"c":[{"z":0,"y":1}]},"A":true}`, `{"A":true,"b":{"c":[{"y":1,"z":0}],"d":1}}`},
		{`[1.0, 1e0, -0, 1E+2, 0.5e-3]`, `[1.0,1e0,-0,1E+2,0.5e-3]`},
		{`"\u0041\u00e9\/\"\\\b\f\n\r\t\u0001\u001F"`, `"Aé/\"\\\b\f\n\r\t\u0001\u001f"`},
		{`"\ud83d\ude00"`, `"😀"`},
		{`"\uD800x"`, `"\ud800x"`},
		{`"\udc00\ud800"`, `"\udc00\ud800"`},
		{"\"\u2028\x7f\"", "\"\u2028\x7f\""},
		{`{"é":1,"z":2,"😀":3,"\uffff":4}`, "{\"z\":2,\"é\":1,\"\uffff\":4,\"😀\":3}"},
		{`{"a\"":1,"a":2,"a\u0000":3}`, `{"a":2,"a\u0000":3,"a\"":1}`},
		{`null`, `null`},
		{` true `, `true`},
		{`[]`, `[]`},
	} {
		got, err := idemhttp.CanonicalJSON(nil, []byte(tc.in))
		if err != nil || string(got) != tc.want {
			t.Errorf("CanonicalJSON(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{
		``, ` `, `{`, `{"a"}`, `{"a":1,}`, `[1,]`, `01`, `1.`, `.5`, `1e`, `+1`, `tru`, `nul`,
		`"abc`, `"\x"`, `"\u12"`, "\"a\x01\"", "\"\xff\"", `{} {}`, `{a:1}`, `'a'`, `NaN`,
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
		// Ambiguous: names encoding/json can take for one.
		`{"b":1,"a":1,"b":0}`, `{"a":{"d":1},"A":true}`, `[{"x":{"k":1,"\u212a":2}}]`, `{"1":0,"01":1}`,
	} {
		dst := []byte("keep")
		got, err := idemhttp.CanonicalJSON(dst, []byte(in))
		if err == nil || string(got) != "keep" {
			t.Errorf("CanonicalJSON(%.40q) = %q, %v; want an error and dst unchanged", in, got, err)
		}
	}
	deep := strings.Repeat("[", 10000) + strings.Repeat("]", 10000)
	if _, err := idemhttp.CanonicalJSON(nil, []byte(deep)); err != nil {
		t.Errorf("depth 10000: %v", err)
	}
}

// FuzzCanonicalJSON checks CanonicalJSON on src, and FingerprintV1 on src
// and other as JSON bodies: two bodies with the same fingerprint decode
// identically with encoding/json (into any, map[string]any, a map with
// integer keys and a struct), and so does every body with its canonical
// form (which every body with its fingerprint shares).
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range [][2]string{
		{`{"b":1,"a":[true,false,null,{"y":"\u00e9","x":-1.5e10}]}`, `{"a":[true,false,null,{"x":-1.5e10,"y":"é"}],"b":1}`},
		{`"\ud800\udc00\ud800"`, `"𐀀\ud800"`},
		{`[]`, `{}`},
		{`0`, `-0`},
		{`{"a":1,"a":2}`, `{"a":2,"a":1}`},
		{`{"\u0000":0,"":1}`, `{"":1,"\u0000":0}`},
		{"\"\u2028\"", `"\u2028"`},
		{`[[[[]]]]`, `[[[[ ]]]]`},
		{`{"a":{"b":{"c":{}}}}`, `{"a":{"b":{"c":{}}}}`},
		{`{"quantity":1,"Quantity":1000}`, `{"Quantity":1000,"quantity":1}`},
		{`{"q":{"k":1,"\u212a":2}}`, `{"q":{"\u212a":2,"k":1}}`},
		{"{\"s\":1,\"\u017f\":2}", "{\"\u017f\":2,\"s\":1}"},
		{`{"\ud800":1,"\udbff":2}`, `{"\udbff":2,"\ud800":1}`},
		{`{"1":1,"01":2}`, `{"01":2,"1":1}`},
	} {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, src, other []byte) {
		out, err := idemhttp.CanonicalJSON(nil, src)
		valid := json.Valid(src) && utf8.Valid(src)
		fp := fingerprintJSON(t, src)
		if fingerprintJSON(t, other) == fp {
			sameDecoding(t, src, other)
		}
		if err != nil {
			if valid && !strings.Contains(err.Error(), "member name") {
				t.Fatalf("valid JSON %q refused: %v", src, err)
			}
			return
		}
		if !valid {
			t.Fatalf("invalid JSON %q accepted as %q", src, out)
		}
		if !json.Valid(out) {
			t.Fatalf("CanonicalJSON(%q) = %q, not JSON", src, out)
		}
		again, err := idemhttp.CanonicalJSON(nil, out)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("not idempotent: %q → %q → %q, %v", src, out, again, err)
		}
		if !reflect.DeepEqual(decode(t, src), decode(t, out)) {
			t.Fatalf("value changed: %q → %q", src, out)
		}
		if fingerprintJSON(t, out) != fp {
			t.Fatalf("%q and its canonical form %q: different fingerprints", src, out)
		}
		sameDecoding(t, src, out)
	})
}

// fingerprintJSON is the fingerprint of body as a JSON request body.
func fingerprintJSON(t *testing.T, body []byte) idem.Fingerprint {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("Content-Type", "application/json")
	fp, err := idemhttp.FingerprintV1(r, body)
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

// fuzzStruct has fields that the fuzz seeds' names match case-insensitively.
type fuzzStruct struct {
	Quantity any `json:"quantity"`
	Q        any `json:"q"`
	K        any `json:"k"`
	S        any `json:"s"`
	A        any `json:"a"`
}

// sameDecoding fails unless encoding/json decodes a and b alike.
func sameDecoding(t *testing.T, a, b []byte) {
	t.Helper()
	if bytes.Equal(a, b) {
		return
	}
	for _, newValue := range []func() any{
		func() any { return new(any) },
		func() any { return new(map[string]any) },
		func() any { return new(map[int]any) },
		func() any { return new(fuzzStruct) },
	} {
		va, vb := newValue(), newValue()
		errA, errB := json.Unmarshal(a, va), json.Unmarshal(b, vb)
		if (errA == nil) != (errB == nil) || !reflect.DeepEqual(va, vb) {
			t.Fatalf("%q and %q share a fingerprint but decode into %T differently: %#v (%v) and %#v (%v)",
				a, b, va, reflect.ValueOf(va).Elem().Interface(), errA, reflect.ValueOf(vb).Elem().Interface(), errB)
		}
	}
}

func decode(t *testing.T, b []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	return v
}
