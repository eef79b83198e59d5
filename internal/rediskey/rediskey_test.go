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

func TestTokenKeys(t *testing.T) {
	d := strings.Repeat("ab", 32)
	tok, set := Token("p", "user:1", d), Tokens("p", "user:1")
	tag := "{" + ScopeTag("user:1") + "}"
	if tok != "p:token:"+tag+":"+d || set != "p:tokens:"+tag+":dXNlcjox" || len(ScopeTag("x")) != 16 {
		t.Fatalf("keys %q, %q", tok, set)
	}
	// Braces in a scope never reach the hash tag.
	if n := Token("p", "}{", d); strings.Count(n, "{") != 1 || strings.Count(n, "}") != 1 {
		t.Fatalf("braces leak into the hash tag: %q", n)
	}
	if ScopeTag("a") == ScopeTag("b") {
		t.Fatal("two scopes share a tag")
	}
}
