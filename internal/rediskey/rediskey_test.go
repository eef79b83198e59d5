package rediskey

import (
	"encoding/base64"
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

// FuzzName checks the names of two records, under valid prefixes: a name
// gives back its prefix, scope and key (so distinct records never share
// one), its Redis Cluster hash tag (between the first '{' and the first
// '}' after it) is the whole identity, and neither a record nor a token
// key of one prefix ever takes another's name.
func FuzzName(f *testing.F) {
	f.Add("p", "a:b", "c", "p", "a", "b:c")
	f.Add("p", "a.b", "c", "p", "a", "b.c")
	f.Add("p", "}{", "}", "p:", "", "")
	f.Add("p:token", "", "", "p", "", "")
	f.Add("", "\xff", "\x00", "", "", "")
	f.Fuzz(func(t *testing.T, p1, s1, k1, p2, s2, k2 string) {
		if ValidatePrefix("x", p1) != nil || ValidatePrefix("x", p2) != nil {
			return
		}
		n1, n2 := Name(p1, s1, k1), Name(p2, s2, k2)
		for _, c := range [][4]string{{n1, p1, s1, k1}, {n2, p2, s2, k2}} {
			p, s, k, ok := parseName(c[0])
			if !ok || p != c[1] || s != c[2] || k != c[3] {
				t.Fatalf("Name(%q, %q, %q) = %q, which reads as (%q, %q, %q), %v", c[1], c[2], c[3], c[0], p, s, k, ok)
			}
		}
		if (n1 == n2) != (p1 == p2 && s1 == s2 && k1 == k2) {
			t.Fatalf("(%q, %q, %q) and (%q, %q, %q): names %q and %q", p1, s1, k1, p2, s2, k2, n1, n2)
		}
		tok, toks := Token(p1, s2, k2), Tokens(p1, s2)
		if hashTag(tok) != ScopeTag(s2) || hashTag(toks) != ScopeTag(s2) {
			t.Fatalf("token keys %q and %q are not in the slot of scope %q", tok, toks, s2)
		}
		if n1 == tok || n1 == toks || tok == toks {
			t.Fatalf("a record and a token key share a name: %q, %q, %q", n1, tok, toks)
		}
	})
}

// parseName reads a record's name back.
func parseName(n string) (prefix, scope, key string, ok bool) {
	prefix, rest, ok := strings.Cut(n, ":{")
	if !ok || !strings.HasSuffix(rest, "}") || hashTag(n) != rest[:len(rest)-1] {
		return "", "", "", false
	}
	s, k, ok := strings.Cut(rest[:len(rest)-1], ".")
	sb, err1 := base64.RawURLEncoding.Strict().DecodeString(s)
	kb, err2 := base64.RawURLEncoding.Strict().DecodeString(k)
	return prefix, string(sb), string(kb), ok && err1 == nil && err2 == nil
}

// hashTag is the part of a key that Redis Cluster hashes.
func hashTag(key string) string {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return key
	}
	end := strings.IndexByte(key[open+1:], '}')
	if end <= 0 {
		return key
	}
	return key[open+1 : open+1+end]
}
