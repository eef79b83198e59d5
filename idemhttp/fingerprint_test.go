package idemhttp_test

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

func fingerprint(t *testing.T, method, target, contentType, body string) idem.Fingerprint {
	t.Helper()
	r := httptest.NewRequest(method, target, nil)
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	fp, err := idemhttp.FingerprintV1(r, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

func TestFingerprintV1(t *testing.T) {
	t.Parallel()
	const js = "application/json"
	same := [][2][4]string{
		{{"POST", "/a?x=1&y=2", js, `{"a":1,"b":[1,2]}`}, {"POST", "/a?y=2&x=1", js, " { \"b\" : [1, 2], \"a\": 1 }\n"}},
		{{"POST", "/a", "application/json; charset=utf-8", `{"a":"é"}`}, {"POST", "/a", "Application/JSON", `{"a":"\u00e9"}`}},
		{{"POST", "/a", "application/merge-patch+json", `{"b":1,"a":2}`}, {"POST", "/a", "application/merge-patch+json", `{"a":2,"b":1}`}},
		{{"POST", "/a?q=a+b", "", ""}, {"POST", "/a?q=a%20b", "", ""}},
		{{"POST", "/a?x=&y", "", ""}, {"POST", "/a?y=&x", "", ""}},
		{{"POST", "/a?&x=1&&", "", ""}, {"POST", "/a?x=1", "", ""}},
	}
	for _, pair := range same {
		a, b := pair[0], pair[1]
		if fa, fb := fingerprint(t, a[0], a[1], a[2], a[3]), fingerprint(t, b[0], b[1], b[2], b[3]); fa != fb {
			t.Errorf("%q and %q: different fingerprints", a, b)
		}
	}
	base := [4]string{"POST", "/a?x=1&x=2", js, `{"a":1}`}
	for _, other := range [][4]string{
		{"PATCH", "/a?x=1&x=2", js, `{"a":1}`},
		{"POST", "/b?x=1&x=2", js, `{"a":1}`},
		{"POST", "/a?x=2&x=1", js, `{"a":1}`}, // order of repeated values matters
		{"POST", "/a?x=1", js, `{"a":1}`},
		{"POST", "/a?x=1&x=2", js, `{"a":1.0}`},
		{"POST", "/a?x=1&x=2", js, `{"a":1,"a":1}`},
		{"POST", "/a?x=1&x=2", "text/plain", `{"a":1}`},
		{"POST", "/a?x=1&x=2", js, ``},
		{"POST", "/a%2Fb?x=1&x=2", js, `{"a":1}`},
	} {
		if fingerprint(t, base[0], base[1], base[2], base[3]) == fingerprint(t, other[0], other[1], other[2], other[3]) {
			t.Errorf("%q and %q: same fingerprint", base, other)
		}
	}
	// Whitespace matters in a non-JSON body, and in invalid JSON.
	if fingerprint(t, "POST", "/a", "text/plain", `{"a":1}`) == fingerprint(t, "POST", "/a", "text/plain", `{"a": 1}`) {
		t.Error("text/plain body canonicalised")
	}
	if fingerprint(t, "POST", "/a", js, `{"a":1`) == fingerprint(t, "POST", "/a", js, `{"a": 1`) {
		t.Error("invalid JSON canonicalised")
	}
	if fingerprint(t, "POST", "/a?a=%zz", "", "") == fingerprint(t, "POST", "/a?a=%25zz", "", "") {
		t.Error("an undecodable query value equals its decoded spelling")
	}
}

// The documented algorithm, computed independently.
func TestFingerprintV1Documented(t *testing.T) {
	t.Parallel()
	field := func(b []byte, s string) []byte {
		b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
		return append(b, s...)
	}
	var in []byte
	in = append(in, "idemhttp-fingerprint-v1\n"...)
	in = field(in, "POST")
	in = field(in, "/orders")
	in = binary.BigEndian.AppendUint64(in, 2)
	in = append(in, 0)
	in = field(in, "a")
	in = field(in, "x y")
	in = append(in, 0)
	in = field(in, "b")
	in = field(in, "2")
	in = append(in, 'J')
	in = field(in, `{"q":1,"sku":"A"}`)
	sum := sha256.Sum256(in)
	want := "v1:" + hex.EncodeToString(sum[:])

	got := fingerprint(t, "POST", "/orders?b=2&a=x+y", "application/json", `{"sku": "A", "q": 1}`)
	if string(got) != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

func TestFingerprintV1Allocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items")
	}
	r := httptest.NewRequest(http.MethodPost, "/orders", nil)
	r.Header.Set("Content-Type", "application/json")
	body := []byte(`{"sku":"A-1","quantity":2,"note":"` + strings.Repeat("x", 900) + `","tags":["a","b"]}`)
	_, _ = idemhttp.FingerprintV1(r, body)
	if n := testing.AllocsPerRun(100, func() { _, _ = idemhttp.FingerprintV1(r, body) }); n > 1 {
		t.Errorf("FingerprintV1 allocates %v times per call, want 1 (the result)", n)
	}
}

// Fingerprints of bodies without duplicate member names are those computed
// before duplicate names were detected: records made then still match.
func TestFingerprintV1Golden(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ method, target, contentType, body, want string }{
		{"POST", "/orders", "application/json", `{"sku":"A-1","quantity":2}`,
			"v1:626f7e331ba67565c841427460e50ee9b279b34d541e53bf8a99edab2ffcb5c2"},
		{"POST", "/orders?b=2&a=x+y", "application/json", `{"sku": "A", "q": 1}`,
			"v1:ecf98a57d6514d6745fc799f866118748190c9f5049b4393e0e98063fd38644e"},
		{"PATCH", "/orders/7", "application/merge-patch+json", `{"note":null,"items":[{"sku":"B","q":1},{"q":2,"sku":"C"}]}`,
			"v1:2c92e6214b900ad6a39d1235d2fbc342e3a1fc6a627be5fd5ebd79a3ce7d5c33"},
		{"POST", "/a", "application/json", `{"a":{"Q":1},"q":{"b":[],"A":{}}}`,
			"v1:3eeaf41d3d0219cfed802520340ee25f53f3c1d774e3f3ed889e848f45541672"},
		{"POST", "/a", "application/json", `{"a_b":1,"ab":2,"a-b":3,"AB_":4}`,
			"v1:a166977c394e29def580adb74e0d5053a857682b71653bb9319640b3665301dc"},
		{"POST", "/a", "application/json", "{\"\u212a\":1,\"\u017f\":2,\"é\":3,\"😀\":4,\"\\ud800\":5,\"z\":6}",
			"v1:a55188f04a83f67c768f1946466be374c60ee596802cd8ccf646b7fd5a78b39a"},
		{"POST", "/a", "application/json", `{"m":1,"l":2,"k":3,"j":4,"i":5,"h":6,"g":7,"f":8,"e":9,"d":10,"c":11,"b":12,"a":13,"n":{"y":"\u00e9\/","x":[1.0,-0,1E+2]}}`,
			"v1:d76821daa3c09bbff02b3a577eb9fd09c3e7f9b72d520022c743317e0de23a45"},
		{"POST", "/a", "application/json", `[{"b":1,"a":2},"x",true,null,0.5e-3]`,
			"v1:bc85c94eb4e3696d364f8508c8c3aec575e247f8f37a8f304fccfe46762859d7"},
		{"POST", "/a", "application/json", `"just a string"`,
			"v1:88f8d2c5a218ec2d70c73a2c5eb1f7f6910c61064d89de436b77ba5dbcc63060"},
		{"POST", "/a", "application/json", `{"a":1`,
			"v1:ce9cc165576d028c0255083fc9c15884a225f3090297d8cafe5f4d7b5c35e00f"},
		{"POST", "/a", "text/plain", `{"b":1,"a":2}`,
			"v1:1d79ecb43bd0fc56427d988fcd112c12af822ca8f539c5626dd9e28fa65a022d"},
		{"POST", "/a", "", ``,
			"v1:43636d66c866c14ef4fda428a64f512af854270c346c0a37ef5807f7147e56e5"},
		{"POST", "/a?x=%zz&y=1&y=0", "application/json", `{}`,
			"v1:e6ba5e1bb7abff168fd18371465313dd45d09c57db7dd5e7219a9e4b6c28d5df"},
	} {
		if got := fingerprint(t, tc.method, tc.target, tc.contentType, tc.body); string(got) != tc.want {
			t.Errorf("%s %s %q %q: %s, want %s", tc.method, tc.target, tc.contentType, tc.body, got, tc.want)
		}
	}
}

// Two bodies that encoding/json can decode differently never share a
// fingerprint: an object whose member names repeat, exactly or as
// encoding/json matches them (case-insensitively, after unescaping, as
// the same integer map key), is hashed as raw bytes.
func TestFingerprintV1AmbiguousNames(t *testing.T) {
	t.Parallel()
	const js = "application/json"
	for _, pair := range [][2]string{
		{`{"quantity":1,"Quantity":1000}`, `{"Quantity":1000,"quantity":1}`},
		{`{"quantity":1,"quantity":1000}`, `{"quantity":1000,"quantity":1}`},
		{`{"order":{"quantity":1,"QUANTITY":1000}}`, `{"order":{"QUANTITY":1000,"quantity":1}}`},
		{`[{"q":1,"Q":2}]`, `[{"Q":2,"q":1}]`},
		{`{"quantity":1,"\u0051uantity":1000}`, `{"\u0051uantity":1000,"quantity":1}`},
		{`{"q":1,"\u0071":2}`, `{"\u0071":2,"q":1}`},
		{"{\"k\":1,\"\u212a\":2}", "{\"\u212a\":2,\"k\":1}"},       // Kelvin sign
		{`{"k":1,"\u212A":2}`, `{"\u212A":2,"k":1}`},               // escaped
		{"{\"s\":1,\"\u017f\":2}", "{\"\u017f\":2,\"s\":1}"},       // long s
		{"{\"é\":1,\"É\":2}", "{\"É\":2,\"é\":1}"},                 // beyond ASCII
		{`{"\ud800":1,"\udbff":2}`, `{"\udbff":2,"\ud800":1}`},     // both decode to U+FFFD
		{`{"\ufffd":1,"\udc00":2}`, `{"\udc00":2,"\ufffd":1}`},     // as does an unpaired low surrogate
		{`{"1":1,"01":2}`, `{"01":2,"1":1}`},                       // one key of a map[int]T
		{`{"+1":1,"1":2}`, `{"1":2,"+1":1}`},                       //
		{`{"0":1,"-0":2}`, `{"-0":2,"0":1}`},                       //
		{`{"a":1,"b":{"x":1,"X":2}}`, `{"b":{"x":1,"X":2},"a":1}`}, // order matters once any object is ambiguous
	} {
		if fingerprint(t, "POST", "/a", js, pair[0]) == fingerprint(t, "POST", "/a", js, pair[1]) {
			t.Errorf("%s and %s: same fingerprint", pair[0], pair[1])
		}
		if _, err := idemhttp.CanonicalJSON(nil, []byte(pair[0])); err == nil {
			t.Errorf("CanonicalJSON(%s) accepted", pair[0])
		}
	}
	// An ambiguous body is hashed as raw bytes: the same bytes match, and
	// no canonical body meets it.
	body := `{"q":1,"Q":2}`
	if fingerprint(t, "POST", "/a", js, body) != fingerprint(t, "POST", "/a", js, body) {
		t.Error("the same ambiguous body: different fingerprints")
	}
	r := httptest.NewRequest("POST", "/a", nil)
	var in []byte
	in = append(in, "idemhttp-fingerprint-v1\n"...)
	for _, s := range []string{"POST", "/a"} {
		in = binary.BigEndian.AppendUint64(in, uint64(len(s)))
		in = append(in, s...)
	}
	in = binary.BigEndian.AppendUint64(in, 0)
	in = append(in, 'R')
	in = binary.BigEndian.AppendUint64(in, uint64(len(body)))
	in = append(in, body...)
	sum := sha256.Sum256(in)
	r.Header.Set("Content-Type", js)
	if got, _ := idemhttp.FingerprintV1(r, []byte(body)); string(got) != "v1:"+hex.EncodeToString(sum[:]) {
		t.Errorf("ambiguous body not hashed as raw bytes: %s", got)
	}
	// Names that encoding/json keeps apart are still sorted.
	for _, pair := range [][2]string{
		{`{"a":{"Q":1},"q":2}`, `{"q":2,"a":{"Q":1}}`},
		{`{"a_b":1,"ab":2}`, `{"ab":2,"a_b":1}`},
		{`{"1":1,"1.0":2,"1e0":3}`, `{"1e0":3,"1.0":2,"1":1}`},
		{"{\"k\":1,\"\u212b\":2}", "{\"\u212b\":2,\"k\":1}"}, // Angstrom sign folds to Å, not k
	} {
		if fingerprint(t, "POST", "/a", js, pair[0]) != fingerprint(t, "POST", "/a", js, pair[1]) {
			t.Errorf("%s and %s: different fingerprints", pair[0], pair[1])
		}
	}
}
