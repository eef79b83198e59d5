package idemhttp

import (
	"fmt"

	"github.com/idemkit/idem"
)

// ParseKey returns the idempotency key in the value of an Idempotency-Key
// header field. Spaces and tabs around the value are ignored. A value that
// starts with '"' is an RFC 8941 sf-string, as
// draft-ietf-httpapi-idempotency-key-header specifies: it is unquoted, its
// only escapes are \" and \\, it holds printable ASCII only, and nothing
// may follow the closing quote (parameters are refused). Any other value
// is the key as sent (Stripe's practice). The key must then pass
// idem.ValidateKey: 1 to 255 bytes of UTF-8 without control characters.
//
// Every error wraps idem.ErrInvalidKey.
func ParseKey(header string) (string, error) {
	s := trimOWS(header)
	if s == "" {
		return "", fmt.Errorf("%w: empty", idem.ErrInvalidKey)
	}
	if s[0] != '"' {
		if err := idem.ValidateKey(s); err != nil {
			return "", err
		}
		return s, nil
	}
	var buf []byte // the unescaped key, once an escape is seen
	for i := 1; i < len(s); i++ {
		switch ch := s[i]; {
		case ch == '\\':
			if i+1 == len(s) {
				return "", fmt.Errorf("%w: quoted key ends in an escape", idem.ErrInvalidKey)
			}
			if e := s[i+1]; e != '"' && e != '\\' {
				return "", fmt.Errorf("%w: quoted key has the escape \\%c; only \\\" and \\\\ are allowed", idem.ErrInvalidKey, e)
			}
			if buf == nil {
				buf = append(make([]byte, 0, len(s)), s[1:i]...)
			}
			i++
			buf = append(buf, s[i])
		case ch == '"':
			if i != len(s)-1 {
				return "", fmt.Errorf("%w: quoted key has data after its closing quote (parameters are not supported)", idem.ErrInvalidKey)
			}
			key := s[1:i]
			if buf != nil {
				key = string(buf)
			}
			if err := idem.ValidateKey(key); err != nil {
				return "", err
			}
			return key, nil
		case ch < 0x20 || ch > 0x7e:
			return "", fmt.Errorf("%w: quoted key has the byte 0x%02x; a quoted key is printable ASCII", idem.ErrInvalidKey, ch)
		default:
			if buf != nil {
				buf = append(buf, ch)
			}
		}
	}
	return "", fmt.Errorf("%w: quoted key has no closing quote", idem.ErrInvalidKey)
}

// trimOWS removes the spaces and tabs around s.
func trimOWS(s string) string {
	for s != "" && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for s != "" && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}
