package idem

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// MaxKeyLen is the largest idempotency key, and the largest scope, in bytes.
const MaxKeyLen = 255

// ValidateKey reports whether key can name a record: 1 to [MaxKeyLen] bytes
// of valid UTF-8 without control characters. The error wraps [ErrInvalidKey].
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	return validateText(key, ErrInvalidKey, "key")
}

// ValidateScope reports whether scope can name a caller: at most
// [MaxKeyLen] bytes of valid UTF-8 without control characters. The empty
// scope is valid (a single-tenant service). The error wraps [ErrInvalidScope].
func ValidateScope(scope string) error {
	return validateText(scope, ErrInvalidScope, "scope")
}

func validateText(s string, sentinel error, what string) error {
	if len(s) > MaxKeyLen {
		return fmt.Errorf("%w: %s is %d bytes, more than %d", sentinel, what, len(s), MaxKeyLen)
	}
	for i, r := range s {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size <= 1 {
				return fmt.Errorf("%w: %s is not valid UTF-8 at byte %d", sentinel, what, i)
			}
		}
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: %s has a control character at byte %d", sentinel, what, i)
		}
	}
	return nil
}
