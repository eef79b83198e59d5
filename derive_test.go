package idem_test

import (
	"strings"
	"testing"

	"github.com/idemkit/idem"
)

// The derivation is a published algorithm: keys derived today must be the
// keys derived after an upgrade, or a retry across the upgrade would make
// the downstream call again under a new key. These values were computed
// independently of this package (SHA-256 over "idem.DeriveKey/v1", scope,
// parent and purpose, each after its length as 8 bytes big-endian;
// "d1_" and unpadded base64url).
func TestDeriveKeyGolden(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		scope, parent, purpose, want string
	}{
		{"", "order-1", "charge", "d1_LZ9O1gvfo-XG01jq_kkQAfhcuHYFaZsp-ee1ouZ7e-k"},
		{"", "order-1", "refund", "d1_WPhvwlor1Xz4rOG99otgIJ4hlmN-nCgFSmfPZYcsIY8"},
		{"", "ab", "c", "d1_tNp-p818yhPxmKObnH7k3o5TPxDD0VYyMtspTRTaUzM"},
		{"", "a", "bc", "d1_21eeWPLoQOKjaG-pizgR6eUWK3AjCAcqnTHgpOc2XVE"},
		{"", "", "", "d1_C5kmes0L3iVecXPMmJxCd9MDKEynpKZi4lN9h4sHf6M"},
		{"", "ключ-🔑", "charge", "d1_9iw8OGgYc6ljl587RvCh__y36kDwrYi4AsoQg4s-QzM"},
		{"", strings.Repeat("x", 300), "p", "d1_ZH1TE16BCc7Ov7fTrBs0QqOVNTW97-IyD-y52WKdrEg"},
		{"user:7", "order-1", "charge", "d1_PtN0xB47ewHqwfzFGDldlrmLCDaik8MTJ9TOSJw9k_I"},
		{"user:8", "order-1", "charge", "d1_qXzrA4JqjE1v8E0U9zAggh5WE1E_1WsHusU48uVvnL0"},
	} {
		l := idem.Lease{Scope: tc.scope, Key: tc.parent}
		if got := l.DeriveKey(tc.purpose); got != tc.want {
			t.Errorf("Lease{%q, %q}.DeriveKey(%q) = %s, want %s", tc.scope, tc.parent, tc.purpose, got, tc.want)
		}
		if tc.scope == "" {
			if got := idem.DeriveKey(tc.parent, tc.purpose); got != tc.want {
				t.Errorf("DeriveKey(%q, %q) = %s, want %s", tc.parent, tc.purpose, got, tc.want)
			}
		}
	}
}

// The lease's owner, fence and end do not change the key: a takeover
// derives what the execution it replaced derived.
func TestLeaseDeriveKeyIgnoresExecution(t *testing.T) {
	t.Parallel()
	a := idem.Lease{Scope: "user:7", Key: "order-1", Owner: "o1", Fence: 1}
	b := idem.Lease{Scope: "user:7", Key: "order-1", Owner: "o2", Fence: 2}
	if a.DeriveKey("charge") != b.DeriveKey("charge") {
		t.Fatal("a takeover derived another key")
	}
	// The scope is not simply glued to the key.
	c := idem.Lease{Scope: "user:7order-1", Key: ""}
	if a.DeriveKey("charge") == c.DeriveKey("charge") {
		t.Fatal("scope and key run together")
	}
	if a.DeriveKey("charge") == idem.DeriveKey("order-1", "charge") {
		t.Fatal("a scoped lease derived the unscoped key")
	}
}

// Field boundaries are part of the hash input: moving bytes from one field
// to the next gives another key.
func TestDeriveKeyBoundaries(t *testing.T) {
	t.Parallel()
	seen := map[string][3]string{}
	s := "abc"
	for i := 0; i <= len(s); i++ {
		for j := i; j <= len(s); j++ {
			f := [3]string{s[:i], s[i:j], s[j:]}
			k := idem.Lease{Scope: f[0], Key: f[1]}.DeriveKey(f[2])
			if prev, dup := seen[k]; dup {
				t.Fatalf("%q and %q derive the same key %s", prev, f, k)
			}
			seen[k] = f
		}
	}
}

// Whatever the inputs, the derived key is a valid key of the fixed
// length, made of base64url characters after its prefix, and stable.
func FuzzDeriveKey(f *testing.F) {
	f.Add("", "", "")
	f.Add("user:7", "order-1", "charge")
	f.Add("", strings.Repeat("k", 1000), "\x00\xff\n")
	f.Fuzz(func(t *testing.T, scope, parent, purpose string) {
		k := idem.Lease{Scope: scope, Key: parent}.DeriveKey(purpose)
		if err := idem.ValidateKey(k); err != nil {
			t.Fatalf("derived key %q is invalid: %v", k, err)
		}
		if len(k) != 46 || !strings.HasPrefix(k, "d1_") {
			t.Fatalf("derived key %q: want d1_ and 43 characters", k)
		}
		for _, c := range []byte(k[3:]) {
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				t.Fatalf("derived key %q has %q", k, c)
			}
		}
		if again := (idem.Lease{Scope: scope, Key: parent}).DeriveKey(purpose); again != k {
			t.Fatalf("not stable: %s then %s", k, again)
		}
		if scope == "" && idem.DeriveKey(parent, purpose) != k {
			t.Fatal("DeriveKey and Lease.DeriveKey differ on the empty scope")
		}
		if idem.DeriveKey(parent, purpose+"x") == idem.DeriveKey(parent, purpose) {
			t.Fatal("another purpose, the same key")
		}
	})
}

func BenchmarkDeriveKey(b *testing.B) {
	l := idem.Lease{Scope: "user:7", Key: "8e03978e-40d5-43e8-9d3c-2d0e8b1b7f11"}
	for b.Loop() {
		_ = l.DeriveKey("charge")
	}
}
