package token

import (
	"context"
	"database/sql"
	"time"
)

// Store keeps tokens by their digest (see Digest), never by their ID.
// Every operation is atomic in the store. The tokentest package pins the
// contract; a store is done when tokentest.Run passes against a real
// server. Tokens validates every argument before it calls a Store: scope is
// 1 to MaxScopeLen bytes of UTF-8 without control characters, digest is
// DigestLen lowercase hex characters, a Spend's Fingerprint "" or
// FingerprintLen lowercase hex characters and its Result at most
// MaxResultLen bytes, ttl positive, keep of Trim not negative.
type Store interface {
	// Insert stores a new, unused token (scope, digest) that expires ttl
	// after the store's now, and returns that expiry. A digest already
	// stored under scope gives ErrDuplicate and changes nothing (an
	// expired token's digest counts as stored until the store forgets
	// it: at once on Redis, at Sweep on SQL). A digest stored under
	// another scope may give ErrDuplicate too (SQL's digest is the
	// table's key); if it does not, the two tokens stay apart: each is
	// spent under its own scope only. Random IDs never meet either way.
	Insert(ctx context.Context, scope, digest string, ttl time.Duration) (expiresAt time.Time, err error)

	// Consume spends the live, unused token digest issued to scope in one
	// atomic step: it marks it used at the store's now, attaches
	// s.Result and s.Fingerprint, moves its expiry to the later of its
	// expiry and now + s.Keep, and returns nil. It returns a *UsedError
	// with the time, the result and the fingerprint of the first use if
	// the token was spent before (until it expires); or ErrInvalid if no
	// live token digest is issued to scope — a token of another scope is
	// neither spent nor reported as used. An empty result reads back as
	// nil. The store does not retain s.Result after Consume returns. It
	// does not compare fingerprints: Tokens does.
	Consume(ctx context.Context, scope, digest string, s Spend) error

	// Trim removes the unused tokens of scope other than its keep (>= 0)
	// newest live ones — newest by expiry, then by digest — and returns
	// how many it removed; expired unused tokens of the scope may be
	// removed (and counted) too. It never removes a used token, live or
	// not (it holds a result for repeats), nor a token of another scope.
	// A removed token answers ErrInvalid.
	Trim(ctx context.Context, scope string, keep int) (int, error)

	// Sweep removes up to limit (> 0) tokens whose expiry has passed, used
	// or not, and returns how many it removed. A store whose entries
	// expire by themselves may remove none and return 0.
	Sweep(ctx context.Context, limit int) (int, error)
}

// TxStore is implemented by stores that can spend a token inside the
// caller's SQL transaction, so that the token is spent if and only if the
// business effect it guards commits.
type TxStore interface {
	// ConsumeTx is Consume, run in tx. It locks the token's row (on
	// SQLite, the database's write lock) until tx ends: a concurrent
	// Consume of the token waits, then sees the outcome of tx.
	ConsumeTx(ctx context.Context, tx *sql.Tx, scope, digest string, s Spend) error
}
