package idemhttp_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
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

// FuzzFingerprintV1 checks FingerprintV1 on a request and on a second one
// with the same method and Content-Type but its own target and body:
//   - the fingerprint is the documented algorithm's, computed here
//     independently from the doc comment;
//   - it does not change when the query's parameters are put in order of
//     name (equal names keeping their order) or a JSON body is re-indented;
//   - two requests with the same fingerprint are the same request to a
//     handler: the same method and escaped path, the same url.Values, and
//     the same body bytes or (both JSON) bodies that encoding/json decodes
//     alike.
func FuzzFingerprintV1(f *testing.F) {
	const js = "application/json"
	for _, s := range [][6]string{
		{"POST", "/a?x=1&y=2", js, `{"a":1,"b":[1,2]}`, "/a?y=2&x=1", " { \"b\" : [1, 2], \"a\": 1 }\n"},
		{"POST", "/a", "application/json; charset=utf-8", `{"a":"é"}`, "/a", `{"a":"\u00e9"}`},
		{"PATCH", "/a", "application/merge-patch+json", `{"b":1,"a":2}`, "/a", `{"a":2,"b":1}`},
		{"POST", "/a?q=a+b", "", "", "/a?q=a%20b", ""},
		{"POST", "/a?x=&y", "", "", "/a?y=&x", ""},
		{"POST", "/a?&x=1&&", "", "", "/a?x=1", ""},
		{"POST", "/a?x=1&x=2", js, `{"a":1}`, "/a?x=2&x=1", `{"a":1}`},
		{"POST", "/a?a=%zz", "", "", "/a?a=%25zz", ""},
		{"POST", "/a%2Fb", js, `{"a":1,"a":1}`, "/a/b", `{"a":1,"a":1}`},
		{"POST", "/a?a%3Db=c", "text/plain", `{"a":1}`, "/a?a=b%3Dc", `{"a": 1}`},
		{"POST", "/a?x=1;y=2", js, `{"quantity":1,"Quantity":1000}`, "/a?x=1;y=3", `{"Quantity":1000,"quantity":1}`},
	} {
		f.Add(s[0], s[1], s[2], []byte(s[3]), s[4], []byte(s[5]))
	}
	f.Fuzz(func(t *testing.T, method, target, contentType string, body []byte, target2 string, body2 []byte) {
		a, err := fuzzRequest(method, target, contentType)
		if err != nil {
			return
		}
		fp, err := idemhttp.FingerprintV1(a, body)
		if err != nil {
			t.Fatal(err)
		}
		if want := documentedV1(a, body); fp != want {
			t.Fatalf("%s %q %q %q: fingerprint %s, the documented algorithm gives %s", method, target, contentType, body, fp, want)
		}

		// Parameters in order of name, and a JSON body re-indented.
		same := *a.URL
		same.RawQuery = sortedQuery(a.URL.RawQuery)
		same2, body3 := *a, body
		same2.URL = &same
		if canon, err := idemhttp.CanonicalJSON(nil, body); err == nil && jsonType(contentType) {
			var ind bytes.Buffer
			if err := json.Indent(&ind, canon, " ", "\t"); err != nil {
				t.Fatalf("canonical %q does not indent: %v", canon, err)
			}
			body3 = ind.Bytes()
		}
		if fp3, _ := idemhttp.FingerprintV1(&same2, body3); fp3 != fp {
			t.Fatalf("%q %q and %q %q: different fingerprints", target, body, same.RawQuery, body3)
		}

		b, err := fuzzRequest(method, target2, contentType)
		if err != nil {
			return
		}
		if fp2, _ := idemhttp.FingerprintV1(b, body2); fp2 != fp {
			return
		}
		if a.URL.EscapedPath() != b.URL.EscapedPath() {
			t.Fatalf("%q and %q share a fingerprint but not a path", target, target2)
		}
		if qa, qb := a.URL.Query(), b.URL.Query(); !reflect.DeepEqual(qa, qb) {
			t.Fatalf("%q and %q share a fingerprint but a handler reads %q and %q", target, target2, qa, qb)
		}
		if !jsonType(contentType) && !bytes.Equal(body, body2) {
			t.Fatalf("%q bodies %q and %q share a fingerprint", contentType, body, body2)
		}
		sameDecoding(t, body, body2)
	})
}

// fuzzRequest is a request with the method, target (a URL or a path) and
// Content-Type given.
func fuzzRequest(method, target, contentType string) (*http.Request, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	r := &http.Request{Method: method, URL: u, Header: http.Header{}}
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	return r, nil
}

// jsonType reports whether FingerprintV1 reads a body of type ct as JSON,
// as its doc says: application/json or a +json suffix, parameters ignored.
func jsonType(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	typ, sub, ok := strings.Cut(mt, "/")
	return mt == "application/json" || ok && typ != "" && len(sub) >= len("+json") && strings.HasSuffix(mt, "+json") && mt != "+json"
}

// sortedQuery is raw's parameters sorted by name (as they decode), equal
// names keeping their order.
func sortedQuery(raw string) string {
	segs := strings.Split(raw, "&")
	name := func(seg string) string {
		n, v, _ := strings.Cut(seg, "=")
		dn, err1 := url.QueryUnescape(n)
		_, err2 := url.QueryUnescape(v)
		if err1 != nil || err2 != nil {
			return n
		}
		return dn
	}
	slices.SortStableFunc(segs, func(x, y string) int { return strings.Compare(name(x), name(y)) })
	return strings.Join(segs, "&")
}

// documentedV1 is FingerprintV1 as its doc comment describes it.
func documentedV1(r *http.Request, body []byte) idem.Fingerprint {
	field := func(b []byte, s string) []byte {
		b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
		return append(b, s...)
	}
	in := []byte("idemhttp-fingerprint-v1\n")
	in = field(in, r.Method)
	in = field(in, r.URL.EscapedPath())
	type param struct {
		tag         byte
		name, value string
	}
	var ps []param
	for _, seg := range strings.Split(r.URL.RawQuery, "&") {
		if seg == "" {
			continue
		}
		n, v, _ := strings.Cut(seg, "=")
		dn, err1 := url.QueryUnescape(n)
		dv, err2 := url.QueryUnescape(v)
		if err1 == nil && err2 == nil {
			ps = append(ps, param{0, dn, dv})
		} else {
			ps = append(ps, param{1, n, v})
		}
	}
	slices.SortStableFunc(ps, func(x, y param) int { return strings.Compare(x.name, y.name) })
	in = binary.BigEndian.AppendUint64(in, uint64(len(ps)))
	for _, p := range ps {
		in = append(in, p.tag)
		in = field(in, p.name)
		in = field(in, p.value)
	}
	canon, err := idemhttp.CanonicalJSON(nil, body)
	if len(body) > 0 && jsonType(r.Header.Get("Content-Type")) && err == nil {
		in = append(in, 'J')
		in = field(in, string(canon))
	} else {
		in = append(in, 'R')
		in = field(in, string(body))
	}
	sum := sha256.Sum256(in)
	return idem.Fingerprint("v1:" + hex.EncodeToString(sum[:]))
}
