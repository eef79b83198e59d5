// Package rediskey names the Redis keys of idem's records, for redisstore
// and tieredstore alike:
//
//	PREFIX:{B64(scope).B64(key)}
//
// where B64 is unpadded base64url (RFC 4648 §5). Its alphabet has neither
// '.' nor '}', so a name decodes to exactly one (scope, key) — distinct
// pairs never meet, whatever separators or braces they contain — and the
// hash tag, the text between the braces, is the whole identity: every key
// of one record shares a Redis Cluster slot.
package rediskey

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
)

// MaxPrefix is the longest prefix, in bytes.
const MaxPrefix = 64

// Name returns the key of (scope, key) under prefix.
func Name(prefix, scope, key string) string {
	enc := base64.RawURLEncoding
	b := make([]byte, 0, len(prefix)+4+enc.EncodedLen(len(scope))+enc.EncodedLen(len(key)))
	b = append(b, prefix...)
	b = append(b, ":{"...)
	b = enc.AppendEncode(b, []byte(scope))
	b = append(b, '.')
	b = enc.AppendEncode(b, []byte(key))
	b = append(b, '}')
	return string(b)
}

// ValidatePrefix reports whether p can start key names: at most MaxPrefix
// bytes, without braces (they would change the hash tag), spaces or
// control characters. pkg starts the error message.
func ValidatePrefix(pkg, p string) error {
	if len(p) > MaxPrefix {
		return fmt.Errorf("%s: prefix is %d bytes, more than %d", pkg, len(p), MaxPrefix)
	}
	for i, r := range p {
		if r == '{' || r == '}' || r == ' ' || r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return fmt.Errorf("%s: prefix %q has %q at byte %d: no braces, spaces or control characters", pkg, p, r, i)
		}
	}
	return nil
}

// ScopeTag returns the hash tag of a scope's submit tokens: the first 8
// bytes of the SHA-256 of scope, in lowercase hex. Every key of one scope
// shares it, and so a Redis Cluster slot. Two scopes share one when their
// hashes meet — among 2^32 scopes (a few billion users) some pair likely
// does — and then share a slot only: each scope has a set of its own
// (Tokens names the scope itself), and a token's hash holds its scope.
func ScopeTag(scope string) string {
	sum := sha256.Sum256([]byte(scope))
	return hex.EncodeToString(sum[:8])
}

// Token returns the key of the submit token digest of scope under prefix:
// PREFIX:token:{SCOPETAG}:DIGEST.
func Token(prefix, scope, digest string) string {
	return prefix + ":token:{" + ScopeTag(scope) + "}:" + digest
}

// Tokens returns the key of the set of scope's unused submit tokens under
// prefix: PREFIX:tokens:{SCOPETAG}:B64(scope), in the slot of the scope's
// tokens, and of this scope only, whatever other scope shares its tag.
func Tokens(prefix, scope string) string {
	return prefix + ":tokens:{" + ScopeTag(scope) + "}:" + base64.RawURLEncoding.EncodeToString([]byte(scope))
}
