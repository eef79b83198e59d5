package sqlstore

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

// equalHeader compares headers as Get returns them: a nil value list and
// an empty one are different, as JSON's null and [] are.
func equalHeader(a, b map[string][]string) bool {
	return maps.EqualFunc(a, b, func(x, y []string) bool { return (x == nil) == (y == nil) && slices.Equal(x, y) })
}

func TestHeaderEncoding(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		h       map[string][]string
		version string // the first bytes of the text
	}{
		{"utf-8", map[string][]string{"Content-Type": {"text/plain; charset=utf-8"}, "X-U": {"ключ-🔑", "\u2028", "<&>", ""}, "X-Nil": nil, "X-Empty": {}}, "{"},
		{"nul and controls", map[string][]string{"X-Nul": {"\x00", "a\x00b"}, "X-C": {"\x01\x7f\t"}}, "{"},
		{"invalid value", map[string][]string{"X-Bad": {"a\xffb", "\x80", ""}, "X-Ok": {"ok"}, "X-Nil": nil}, "2:"},
		{"invalid name", map[string][]string{"X-\xff": {"v"}}, "2:"},
		{"surrogate", map[string][]string{"X-S": {"\xed\xa0\x80"}}, "2:"},
	} {
		text, err := encodeHeader(tc.h)
		if err != nil {
			t.Fatalf("%s: encode: %v", tc.name, err)
		}
		if !strings.HasPrefix(text, tc.version) || strings.ContainsRune(text, 0) {
			t.Errorf("%s: encoded as %q, want a text starting with %q and without NUL", tc.name, text, tc.version)
		}
		got, err := decodeHeader(text)
		if err != nil {
			t.Fatalf("%s: decode %q: %v", tc.name, text, err)
		}
		if !equalHeader(got, tc.h) {
			t.Errorf("%s: round trip = %q, want %q", tc.name, got, tc.h)
		}
	}
	// A record written before version 2 existed reads as it did.
	old := `{"Content-Type":["application/json"],"Link":["\u003c/a\u003e; rel=next","\u003c/b\u003e"],"X-E":[""]}`
	got, err := decodeHeader(old)
	want := map[string][]string{"Content-Type": {"application/json"}, "Link": {"</a>; rel=next", "</b>"}, "X-E": {""}}
	if err != nil || !equalHeader(got, want) {
		t.Errorf("version 1 text = %q, %v; want %q", got, err, want)
	}
	for _, bad := range []string{"[]", "2:{", "2:{\"!!\":[]}", "2:{\"QQ==\":[\"!\"]}", "3:{}", "x"} {
		if h, err := decodeHeader(bad); err == nil {
			t.Errorf("decodeHeader(%q) = %q, want an error", bad, h)
		}
	}
}

func FuzzHeaderEncoding(f *testing.F) {
	f.Add("Content-Type", "text/plain", "X-B", "a\xffb")
	f.Add("X-\x00", "\x00", "", "")
	f.Add("\xff", "\xfe", "X", "\u2028")
	f.Fuzz(func(t *testing.T, n1, v1, n2, v2 string) {
		h := map[string][]string{n1: {v1, v2}, n2: {v2}}
		text, err := encodeHeader(h)
		if err != nil {
			t.Fatal(err)
		}
		if strings.ContainsRune(text, 0) {
			t.Fatalf("encoded text %q holds NUL", text)
		}
		got, err := decodeHeader(text)
		if err != nil {
			t.Fatalf("decode %q: %v", text, err)
		}
		if !equalHeader(got, h) {
			t.Fatalf("round trip of %q = %q", h, got)
		}
	})
}

// FuzzDecodeHeader reads any text as a response_header column: it decodes
// or fails without panicking, and what decodes encodes to a text without
// NUL that decodes to the same header, in the version the header needs
// (1 when every name and value is UTF-8).
func FuzzDecodeHeader(f *testing.F) {
	for _, s := range []string{
		`{"Content-Type":["application/json"],"Link":["\u003c/a\u003e; rel=next","\u003c/b\u003e"],"X-E":[""]}`,
		`2:{"WC3/":["Yf9i","gA==",""],"WC1Paw==":["b2s="],"WC1OaWw=":null}`,
		`{"a":null,"b":[],"c":[null]}`, `{"\ud800":["\udfff"]}`, "{\"a\":[\"\xff\"]}",
		"[]", "2:{", "2:{\"!!\":[]}", "2:{\"QQ==\":[\"!\"]}", "2:{\"QQ=\\r\\n=\":[]}", "3:{}", "x", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		h, err := decodeHeader(text)
		if err != nil || len(h) == 0 {
			return
		}
		again, err := encodeHeader(h)
		if err != nil {
			t.Fatalf("%q decodes to %q, which does not encode: %v", text, h, err)
		}
		if strings.ContainsRune(again, 0) || strings.HasPrefix(again, headerV2) == validHeader(h) {
			t.Fatalf("%q decodes to %q, encoded as %q", text, h, again)
		}
		if h2, err := decodeHeader(again); err != nil || !equalHeader(h2, h) {
			t.Fatalf("%q decodes to %q, encoded as %q, which decodes to %q, %v", text, h, again, h2, err)
		}
	})
}
