package idem_test

import (
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem"
)

func TestValidateKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, key string
		ok        bool
	}{
		{"ascii", "order-42", true},
		{"uuid", "8e2b8f2c-6a0f-4a0e-9d3c-2d0e8b1b7f11", true},
		{"one byte", "k", true},
		{"utf8", "ключ-🔑", true},
		{"255 bytes", strings.Repeat("k", 255), true},
		{"255 bytes of 2-byte runes", strings.Repeat("я", 127) + "k", true},
		{"255 bytes of 3-byte runes", strings.Repeat("€", 85), true},
		{"spaces", " a b ", true},
		{"quotes and separators", `"a":b/c|d{e}`, true},
		{"replacement character", "\uFFFD", true},
		{"line separator (not a control)", "a\u2028b", true},
		{"empty", "", false},
		{"256 bytes", strings.Repeat("k", 256), false},
		{"256 bytes of 2-byte runes", strings.Repeat("я", 128), false},
		{"NUL", "\x00", false},
		{"NUL inside", "a\x00b", false},
		{"newline", "a\nb", false},
		{"tab", "\tk", false},
		{"carriage return", "k\r", false},
		{"escape", "\x1b[0m", false},
		{"DEL", "\x7f", false},
		{"C1 control", "a\u0085b", false},
		{"C1 control U+009F", "\u009f", false},
		{"invalid byte", "a\xffb", false},
		{"truncated rune", "ключ"[:3], false},
		{"overlong encoding", "\xc0\xaf", false},
		{"surrogate half", "\xed\xa0\x80", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := idem.ValidateKey(tc.key)
			if tc.ok && err != nil {
				t.Fatalf("ValidateKey(%q) = %v, want nil", tc.key, err)
			}
			if !tc.ok && !errors.Is(err, idem.ErrInvalidKey) {
				t.Fatalf("ValidateKey(%q) = %v, want ErrInvalidKey", tc.key, err)
			}
			if err != nil && errors.Is(err, idem.ErrInvalidScope) {
				t.Fatalf("ValidateKey(%q) = %v, which is ErrInvalidScope", tc.key, err)
			}
		})
	}
}

func TestValidateScope(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, scope string
		ok          bool
	}{
		{"empty (single tenant)", "", true},
		{"tenant", "tenant-42", true},
		{"utf8", "тенант/🔑", true},
		{"255 bytes", strings.Repeat("s", 255), true},
		{"256 bytes", strings.Repeat("s", 256), false},
		{"newline", "tenant\n", false},
		{"NUL", "\x00", false},
		{"invalid UTF-8", "\xff", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := idem.ValidateScope(tc.scope)
			if tc.ok && err != nil {
				t.Fatalf("ValidateScope(%q) = %v, want nil", tc.scope, err)
			}
			if !tc.ok && (!errors.Is(err, idem.ErrInvalidScope) || errors.Is(err, idem.ErrInvalidKey)) {
				t.Fatalf("ValidateScope(%q) = %v, want ErrInvalidScope", tc.scope, err)
			}
		})
	}
}

func TestAcquireRequestValidate(t *testing.T) {
	t.Parallel()
	good := idem.AcquireRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: 1, Retention: 1}
	if err := good.Validate(); err != nil {
		t.Fatalf("Validate(%+v) = %v", good, err)
	}
	for name, mutate := range map[string]func(*idem.AcquireRequest){
		"empty key":          func(r *idem.AcquireRequest) { r.Key = "" },
		"bad scope":          func(r *idem.AcquireRequest) { r.Scope = "\n" },
		"zero lease":         func(r *idem.AcquireRequest) { r.Lease = 0 },
		"negative lease":     func(r *idem.AcquireRequest) { r.Lease = -1 },
		"zero retention":     func(r *idem.AcquireRequest) { r.Retention = 0 },
		"negative retention": func(r *idem.AcquireRequest) { r.Retention = -1 },
	} {
		r := good
		mutate(&r)
		if err := r.Validate(); err == nil {
			t.Errorf("Validate with %s = nil, want an error", name)
		}
	}
}

// acceptable is the definition ValidateKey and ValidateScope implement.
func acceptable(s string) bool {
	if len(s) > idem.MaxKeyLen || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

func FuzzValidateKey(f *testing.F) {
	for _, seed := range []string{"", "k", "order-42", "ключ-🔑", "a\x00b", "\xff", "\u0085", strings.Repeat("k", 255), strings.Repeat("я", 128)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, key string) {
		err := idem.ValidateKey(key)
		if err != nil && !errors.Is(err, idem.ErrInvalidKey) {
			t.Fatalf("ValidateKey(%q) = %v, which does not wrap ErrInvalidKey", key, err)
		}
		if want := key != "" && acceptable(key); (err == nil) != want {
			t.Fatalf("ValidateKey(%q) = %v; acceptable: %v", key, err, want)
		}
	})
}

func FuzzValidateScope(f *testing.F) {
	for _, seed := range []string{"", "tenant", "тенант", "\n", "\xff", strings.Repeat("s", 256)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, scope string) {
		err := idem.ValidateScope(scope)
		if err != nil && !errors.Is(err, idem.ErrInvalidScope) {
			t.Fatalf("ValidateScope(%q) = %v, which does not wrap ErrInvalidScope", scope, err)
		}
		if want := acceptable(scope); (err == nil) != want {
			t.Fatalf("ValidateScope(%q) = %v; acceptable: %v", scope, err, want)
		}
	})
}
