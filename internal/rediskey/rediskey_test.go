package rediskey

import (
	"strings"
	"testing"
)

func TestName(t *testing.T) {
	if got := Name("p", "t", "k"); got != "p:{dA.aw}" {
		t.Fatalf("Name = %q", got)
	}
	// Pairs that a naive join would confuse stay apart.
	if Name("p", "a:b", "c") == Name("p", "a", "b:c") || Name("p", "a.b", "c") == Name("p", "a", "b.c") {
		t.Fatal("distinct pairs share a name")
	}
	if n := Name("p", "}{", "}"); strings.Count(n, "{") != 1 || strings.Count(n, "}") != 1 {
		t.Fatalf("braces leak into the hash tag: %q", n)
	}
}

func TestValidatePrefix(t *testing.T) {
	for _, ok := range []string{"idem", "a:b-c_d.e", strings.Repeat("x", 64)} {
		if err := ValidatePrefix("x", ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"a{", "b}", "c d", "e\n", strings.Repeat("x", 65)} {
		if err := ValidatePrefix("x", bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
