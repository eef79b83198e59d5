package idem

import (
	"context"
	"database/sql"
	"time"
)

// Store keeps records. Every operation is atomic in the store and costs one
// round trip. The storetest package pins the contract; a store is done when
// storetest.Run passes against a real server.
type Store interface {
	// Acquire claims the lease on (scope, key):
	//   - no record, or a record past its ExpiresAt (completed, or
	//     processing and abandoned for its retention), whatever its
	//     fingerprint: a new record (processing, new owner, fence = 1 for a
	//     new record, old fence + 1 for a replaced one; TookOver if the
	//     replaced record was processing) → Acquired;
	//   - a record with another fingerprint (live completed, or processing
	//     whether or not its lease has ended) → Mismatch;
	//   - a processing record whose lease has ended → taken over: new owner,
	//     fence + 1, TookOver → Acquired;
	//   - a processing record with a live lease → InFlight;
	//   - a live completed record → Completed.
	// Stores validate the request (AcquireRequest.Validate).
	Acquire(ctx context.Context, req AcquireRequest) (AcquireResult, error)

	// Complete stores resp and marks the record completed, kept for
	// retention (> 0) from the store's now. It succeeds while the record is
	// processing with l's owner and fence — even after the lease ended, as
	// long as nobody took over. Called again with the same owner and fence
	// on a record it already completed (a retry after the reply of a
	// completion that committed was lost), it returns nil and the record
	// keeps the response it holds. Otherwise it returns ErrLeaseLost. A
	// store does not retain resp's Body or Header after Complete returns:
	// it copies or encodes what it keeps, so the caller may reuse them.
	Complete(ctx context.Context, l Lease, resp Response, retention time.Duration) error

	// Release deletes the processing record held by l so that a retry runs
	// again; ErrLeaseLost if l no longer holds it.
	Release(ctx context.Context, l Lease) error

	// Extend moves the lease's end to the store's now + ttl (> 0) and
	// returns the lease with its new Until; ErrLeaseLost if l no longer holds
	// the record.
	Extend(ctx context.Context, l Lease, ttl time.Duration) (Lease, error)

	// Get returns the record, expired or not; ErrNotFound if none.
	Get(ctx context.Context, scope, key string) (Record, error)

	// Delete removes the record whatever its state (operator eviction);
	// ErrNotFound if none. An operator who read the record first should
	// evict with ConditionalDeleter.DeleteIf where the store has it, so
	// that a record that changed since is not removed.
	Delete(ctx context.Context, scope, key string) error

	// Sweep removes up to limit records whose ExpiresAt has passed (a limit
	// <= 0 means 1000) and returns how many it removed. It never removes a
	// processing record whose lease is live.
	Sweep(ctx context.Context, limit int) (int, error)
}

// TxCompleter is implemented by stores that can complete a record inside
// the caller's SQL transaction, so that the business effect and the stored
// response commit together or not at all.
type TxCompleter interface {
	// CompleteTx is Complete, run in tx. It takes the record's row lock
	// (on SQLite, the database's write lock) until tx ends; a takeover
	// attempt waits for it and then sees the outcome of tx. On a record
	// already completed with l's owner and fence (an earlier CompleteTx of
	// this lease committed, and this is a retry after its reply was lost)
	// it returns an error matching ErrFinished and writes nothing: the
	// caller must roll tx back, since the effect committed with the
	// earlier transaction. A record held by another owner or fence, or
	// gone, gives ErrLeaseLost.
	CompleteTx(ctx context.Context, tx *sql.Tx, l Lease, resp Response, retention time.Duration) error
}

// ConditionalDeleter is implemented by stores that can delete a record
// only while it is the one the caller read: operator eviction, where a
// person looks at a record and then decides, must not remove a record that
// another execution took over (or created) in the meantime, or a retry
// would run the request again while that execution runs.
//
// A record's Owner and Fence name one incarnation of it: a takeover and
// the replacement of an expired record change both, and a record created
// after a deletion has a new owner. What the execution holding the record
// does to it (renewing its lease, completing it) keeps them, so such a
// record is still the one read.
type ConditionalDeleter interface {
	// DeleteIf removes the record of (scope, key), whatever its state,
	// only if its Owner and Fence are still owner and fence. The check and
	// the deletion are atomic in the store, and a deletion costs one round
	// trip (a store may read the record again, after a refusal, to tell
	// the two errors apart). It returns ErrNotFound if there
	// is no record, and an error matching ErrRecordChanged, leaving the
	// record as it is, if the record has another owner or fence.
	DeleteIf(ctx context.Context, scope, key, owner string, fence int64) error
}

// DefaultSweepLimit is the number of records Sweep removes when given a
// limit <= 0.
const DefaultSweepLimit = 1000
