package idem

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
)

// derivedKeyPrefix starts every derived key; the 1 is the version of the
// derivation below, so a future change cannot collide with today's keys.
const derivedKeyPrefix = "d1_"

// derivationDomain separates the derivation's hash inputs from any other
// use of SHA-256 over the same strings.
const derivationDomain = "idem.DeriveKey/v1"

// DeriveKey returns the idempotency key of a call made downstream while
// handling the request keyed parent: the call to a payment provider made
// while creating an order, a message published while handling a callback.
// purpose names the call among the calls that request makes ("charge",
// "reserve-stock"), so each gets its own key.
//
// The key is stable: a retry of the request (same parent) makes the same
// downstream call with the same key, so the downstream service de-duplicates
// it however often the request is retried or taken over. Different
// (parent, purpose) pairs get different keys: the key is "d1_" and the
// unpadded base64url of a SHA-256 over both strings, each prefixed with its
// length, so no choice of strings can make two pairs write the same hash
// input. It is 46 bytes of [A-Za-z0-9_-], valid (ValidateKey) and within
// every limit whatever parent and purpose are, including empty or too long
// for a key themselves.
//
// parent alone does not name a request: two callers (scopes) may send the
// same key. When downstream calls of different scopes meet in one key space
// (one account at a payment provider), derive from the lease instead, with
// [Lease.DeriveKey], which includes the scope; for a single-tenant service
// (the empty scope) both give the same key.
func DeriveKey(parent, purpose string) string {
	return deriveKey("", parent, purpose)
}

// DeriveKey returns the idempotency key of a downstream call, named by
// purpose, made by the execution that holds l: [DeriveKey] over the lease's
// scope and key. It depends on the scope and the key only, never on the
// owner or the fence, so the execution that takes over an abandoned lease
// derives the same key as the one it replaced, and equal keys in two scopes
// derive different ones. With the empty scope it equals
// DeriveKey(l.Key, purpose).
func (l Lease) DeriveKey(purpose string) string {
	return deriveKey(l.Scope, l.Key, purpose)
}

// deriveKey hashes the domain and the three fields, each prefixed with its
// length as 8 bytes big-endian.
func deriveKey(scope, parent, purpose string) string {
	fields := [...]string{derivationDomain, scope, parent, purpose}
	n := 0
	for _, s := range fields {
		n += 8 + len(s)
	}
	in := make([]byte, 0, n)
	for _, s := range fields {
		in = binary.BigEndian.AppendUint64(in, uint64(len(s)))
		in = append(in, s...)
	}
	sum := sha256.Sum256(in)
	out := make([]byte, len(derivedKeyPrefix)+base64.RawURLEncoding.EncodedLen(len(sum)))
	copy(out, derivedKeyPrefix)
	base64.RawURLEncoding.Encode(out[len(derivedKeyPrefix):], sum[:])
	return string(out)
}
