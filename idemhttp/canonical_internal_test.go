package idemhttp

import (
	"bytes"
	"strings"
	"testing"
)

// TestCanonicalJSONLinear checks that putting members in order costs work
// in proportion to the body, however deep the objects out of order nest:
// a body of nested objects, each with its members out of order, around a
// large string, must not make every level copy everything inside it (a
// request body of 1 MiB then cost seconds of CPU, against milliseconds to
// decode it).
func TestCanonicalJSONLinear(t *testing.T) {
	t.Parallel()
	const depth = 2000
	body := strings.Repeat(`{"b":`, depth) + `"` + strings.Repeat("x", 100<<10) + `"` + strings.Repeat(`,"a":0}`, depth)
	want := strings.Repeat(`{"a":0,"b":`, depth) + `"` + strings.Repeat("x", 100<<10) + `"` + strings.Repeat(`}`, depth)
	var c canonicalizer
	c.begin([]byte(body), nil)
	out, err := c.canonical()
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != want {
		t.Fatalf("canonical form wrong (length %d, want %d)", len(out), len(want))
	}
	if limit := 2 * len(body); c.moved > limit {
		t.Errorf("putting the members of a %d-byte body in order copied %d bytes, want at most %d", len(body), c.moved, limit)
	}
}

// canonicalBoth canonicalises src with and without the shortcuts.
func canonicalBoth(src []byte) (fast, ref []byte, fastErr, refErr error, moved int) {
	var c canonicalizer
	c.begin(src, nil)
	fast, fastErr = c.canonical()
	moved = c.moved
	c.reference = true
	c.begin(src, nil)
	ref, refErr = c.canonical()
	return fast, ref, fastErr, refErr, moved
}

// FuzzCanonicalShortcuts: the shortcuts (names compared pairwise in
// small objects, small objects put in order in place) give the same
// canonical form and the same errors as the plain way, and copy no more
// than twice the text to put members in order.
func FuzzCanonicalShortcuts(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":2}`,
		`[{"b":1,"a":{"d":1,"c":2}},{"y":[{"q":1,"p":2}],"x":0}]`,
		`{"z":{"b":1,"a":2},"y":{"d":{"f":1,"e":2},"c":3},"x":[{"h":1,"g":2}]}`,
		`{"quantity":1,"Quantity":2}`, `{"b":0,"k":1,"\u212a":2}`, "{\"s\":1,\"\u017f\":2}",
		`{"1":1,"01":2}`, `{"+1":1,"1":2}`, `{"-0":1,"0":2}`, `{"":1,"a":2,"":3}`,
		`{"a1":1,"A1":2}`, `{"1a":1,"1A":2}`, `{"\ud800":1,"\udbff":2,"\ufffd":3}`,
		`{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"A":10}`,
		`{"j":1,"i":2,"h":3,"g":4,"f":5,"e":6,"d":7,"c":8,"b":9,"a":10,"m":11,"l":12,"k":13,"n":14}`,
		`{"b":{"b":{"b":1,"a":2},"a":2},"a":{"b":1,"a":{"b":1,"a":2}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		fast, ref, fastErr, refErr, moved := canonicalBoth(src)
		if (fastErr == nil) != (refErr == nil) || fastErr != nil && fastErr.Error() != refErr.Error() {
			t.Fatalf("%q: error %v with the shortcuts, %v without", src, fastErr, refErr)
		}
		if !bytes.Equal(fast, ref) {
			t.Fatalf("%q: %q with the shortcuts, %q without", src, fast, ref)
		}
		if moved > 2*len(src) {
			t.Fatalf("%q: %d bytes copied to put members in order", src, moved)
		}
	})
}

// TestSameNameAsFolded: sameName agrees with comparing folded names on
// names of every kind (plain, integers, non-ASCII, folding specials).
func TestSameNameAsFolded(t *testing.T) {
	t.Parallel()
	names := []string{"", "a", "A", "ab", "aB", "b", "k", "K", "\u212a", "s", "S", "\u017f",
		"1", "01", "+1", "-1", "-01", "0", "-0", "+0", "00", "1a", "1A", "a1", "A1", "+", "-",
		"é", "É", "\ufffd", "\xed\xa0\x80", "sku", "SKU", "sKu", "qty", "price", "note", "x"}
	var c canonicalizer
	for _, a := range names {
		for _, b := range names {
			want := bytes.Equal(appendFoldedName(nil, []byte(a)), appendFoldedName(nil, []byte(b)))
			if got := c.sameName([]byte(a), []byte(b), false); got != want {
				t.Errorf("sameName(%q, %q, not plain) = %v, folded names equal: %v", a, b, got, want)
			}
			if got := c.sameName([]byte(a), []byte(b), isPlainName([]byte(a)) && isPlainName([]byte(b))); got != want {
				t.Errorf("sameName(%q, %q) = %v, folded names equal: %v", a, b, got, want)
			}
		}
	}
}
