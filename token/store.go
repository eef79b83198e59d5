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
// 1 to MaxScopeLen bytes of UTF-8 without control characters, digest is DigestLen lowercase hex characters,
// result at most MaxResultLen bytes, ttl positive.
type Store interface {
	// Insert stores a new, unused token (scope, digest) that expires ttl
	// after the store's now, and returns that expiry. A digest already
	// stored gives ErrDuplicate and changes nothing (an expired token's
	// digest counts as stored until the store forgets it: at once on
	// Redis, at Sweep on SQL).
	Insert(ctx context.Context, scope, digest string, ttl time.Duration) (expiresAt time.Time, err error)

	// Consume spends the live token digest issued to scope, attaching
	// result, in one atomic step, and returns nil; or returns a
	// *UsedError with the time and the result of its first use if it was
	// spent before (until it expires); or ErrInvalid if no live token
	// digest is issued to scope — a token of another scope is neither
	// spent nor reported as used. An empty result reads back as nil. The
	// store does not retain result after Consume returns.
	Consume(ctx context.Context, scope, digest string, result []byte) error

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
	ConsumeTx(ctx context.Context, tx *sql.Tx, scope, digest string, result []byte) error
}
