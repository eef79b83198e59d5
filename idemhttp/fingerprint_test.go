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
