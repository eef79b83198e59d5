package idemhttp_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemkit/idem/idemhttp"
)

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{" {\n\t\"b\" : [ 1 , 2 ] ,\r\n \"a\" : { } } ", `{"a":{},"b":[1,2]}`},
		{`{"a":{"d":1,"c":[{"z":0,"y":1}]},"A":true}`, `{"A":true,"a":{"c":[{"y":1,"z":0}],"d":1}}`},
		{`[1.0, 1e0, -0, 1E+2, 0.5e-3]`, `[1.0,1e0,-0,1E+2,0.5e-3]`},
		{`"\u0041\u00e9\/\"\\\b\f\n\r\t\u0001\u001F"`, `"Aé/\"\\\b\f\n\r\t\u0001\u001f"`},
		{`"\ud83d\ude00"`, `"😀"`},
		{`"\uD800x"`, `"\ud800x"`},
		{`"\udc00\ud800"`, `"\udc00\ud800"`},
		{"\"\u2028\x7f\"", "\"\u2028\x7f\""},
		{`{"b":1,"a":1,"b":0}`, `{"a":1,"b":1,"b":0}`}, // duplicates kept, in order
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

func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":[true,false,null,{"y":"\u00e9","x":-1.5e10}]}`,
		`"\ud800\udc00\ud800"`, `[]`, `{}`, `0`, `{"a":1,"a":2}`, `{"\u0000":0,"":1}`,
		"\"\u2028\"", `[[[[]]]]`, `{"a":{"b":{"c":{}}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		out, err := idemhttp.CanonicalJSON(nil, src)
		valid := json.Valid(src) && utf8.Valid(src)
		if err != nil {
			if valid {
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
		if valid && !reflect.DeepEqual(decode(t, src), decode(t, out)) {
			t.Fatalf("value changed: %q → %q", src, out)
		}
	})
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
