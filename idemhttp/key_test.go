package idemhttp_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"abc", "abc"},
		{"  abc\t", "abc"},
		{"8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{`"abc"`, "abc"},
		{` "a b" `, "a b"},
		{`"a\"b\\c"`, `a"b\c`},
		{`a"b`, `a"b`},
		{"clé", "clé"},
		{strings.Repeat("x", 255), strings.Repeat("x", 255)},
		{`"` + strings.Repeat("x", 255) + `"`, strings.Repeat("x", 255)},
	} {
		got, err := idemhttp.ParseKey(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{
		"", " ", "\t", strings.Repeat("x", 256), `"` + strings.Repeat("x", 256) + `"`,
		"a\x00b", "a\nb", "a\x7fb", "\xff", `""`, `"abc`, `"a\"`, `"a\b"`, `"a"b"`,
		`"abc";p=1`, "\"é\"", "\"a\tb\"",
	} {
		got, err := idemhttp.ParseKey(in)
		if err == nil || !errors.Is(err, idem.ErrInvalidKey) {
			t.Errorf("ParseKey(%q) = %q, %v; want an error wrapping ErrInvalidKey", in, got, err)
		}
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, `"a\\"`, ` x `, "", `"`, `"\`, "\xff", "a\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		key, err := idemhttp.ParseKey(in)
		if err != nil {
			if !errors.Is(err, idem.ErrInvalidKey) {
				t.Fatalf("ParseKey(%q): error %v does not wrap ErrInvalidKey", in, err)
			}
			return
		}
		if err := idem.ValidateKey(key); err != nil {
			t.Fatalf("ParseKey(%q) = %q, which ValidateKey refuses: %v", in, key, err)
		}
		// A key survives being sent quoted, when it can be.
		if printableASCII(key) {
			quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
			if again, err := idemhttp.ParseKey(quoted); err != nil || again != key {
				t.Fatalf("ParseKey(%q) = %q, %v; want %q", quoted, again, err, key)
			}
		}
	})
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
