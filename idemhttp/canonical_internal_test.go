package idemhttp

import (
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
