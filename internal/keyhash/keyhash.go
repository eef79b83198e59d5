// Package keyhash carries the hash of a record's scope and key
// (idem.HashKey) from the code that computed it to the code that reports
// it, so that an observed request computes it once: idemhttp and idemgrpc
// compute it for their request's event and hand it to the Guard in the
// context of Begin; the Guard hands it to its observed store's events and
// its lease events. It imports the standard library only.
package keyhash

import "context"

// CtxKey is the context key of a *Value.
type CtxKey struct{}

// Value is the hash of (Scope, Key).
type Value struct {
	Scope, Key, Hash string
}

// From returns the *Value ctx carries for (scope, key), or nil if it
// carries none, or one of another pair.
func From(ctx context.Context, scope, key string) *Value {
	v, _ := ctx.Value(CtxKey{}).(*Value)
	if v == nil || v.Hash == "" || v.Scope != scope || v.Key != key {
		return nil
	}
	return v
}
