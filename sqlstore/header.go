package sqlstore

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// A response's header is kept in the text column response_header in one
// of two encodings, told apart by the first byte:
//
//   - version 1, '{': the JSON object encoding/json makes of the
//     map[string][]string. JSON text holds Unicode only, so it keeps a
//     string exactly if and only if it is valid UTF-8 (json.Marshal
//     replaces each invalid byte with U+FFFD). Every record written
//     before version 2 existed is in this form, and it is still the form
//     written whenever every name and value is valid UTF-8, so that a
//     build that knows only version 1 reads such records too.
//   - version 2, "2:" and then JSON: an object whose names and values are
//     the standard base64 (with padding) of the header's names and
//     values, each kept byte for byte whatever it holds. It is written
//     when some name or value is not valid UTF-8.
//
// Both forms are ASCII or UTF-8 text, as the column types require
// (MySQL's is utf8mb4), and neither holds a NUL byte (PostgreSQL's text
// cannot): JSON escapes it.
const headerV2 = "2:"

// encodeHeader returns the text kept for h; h must not be empty.
func encodeHeader(h map[string][]string) (string, error) {
	if validHeader(h) {
		b, err := json.Marshal(h)
		return string(b), err
	}
	enc := make(map[string][]string, len(h))
	for name, values := range h {
		var vs []string
		if values != nil {
			vs = make([]string, len(values))
			for i, v := range values {
				vs[i] = base64.StdEncoding.EncodeToString([]byte(v))
			}
		}
		enc[base64.StdEncoding.EncodeToString([]byte(name))] = vs
	}
	b, err := json.Marshal(enc)
	return headerV2 + string(b), err
}

// validHeader reports whether every name and value of h is valid UTF-8,
// which version 1 keeps exactly.
func validHeader(h map[string][]string) bool {
	for name, values := range h {
		if !utf8.ValidString(name) {
			return false
		}
		for _, v := range values {
			if !utf8.ValidString(v) {
				return false
			}
		}
	}
	return true
}

// decodeHeader reads text written by encodeHeader, in either version.
func decodeHeader(text string) (map[string][]string, error) {
	var h map[string][]string
	if rest, ok := strings.CutPrefix(text, headerV2); ok {
		var enc map[string][]string
		if err := json.Unmarshal([]byte(rest), &enc); err != nil {
			return nil, err
		}
		h = make(map[string][]string, len(enc))
		for name, values := range enc {
			n, err := base64.StdEncoding.DecodeString(name)
			if err != nil {
				return nil, fmt.Errorf("header name %q: %w", name, err)
			}
			var vs []string
			if values != nil {
				vs = make([]string, len(values))
				for i, v := range values {
					b, err := base64.StdEncoding.DecodeString(v)
					if err != nil {
						return nil, fmt.Errorf("header %q value %d: %w", n, i, err)
					}
					vs[i] = string(b)
				}
			}
			h[string(n)] = vs
		}
		return h, nil
	}
	if !strings.HasPrefix(text, "{") {
		return nil, errors.New("unknown header encoding")
	}
	if err := json.Unmarshal([]byte(text), &h); err != nil {
		return nil, err
	}
	return h, nil
}
