package inbox

import (
	"context"
	"database/sql"
	"time"
)

// Status is the state of a consume record.
type Status string

// The statuses of a consume record.
const (
	// StatusProcessing: a consumer holds the record's lease and runs the
	// handler; after the lease ends, the next delivery takes it over.
	StatusProcessing Status = "processing"
	// StatusSucceeded: the effect happened (for HandleTx: it committed
	// with the record). Every later delivery is a duplicate.
	StatusSucceeded Status = "succeeded"
	// StatusFailed: the handler failed and the message waits for its
	// redelivery, which runs the handler again. A redelivery that never
	// comes (the broker gave up) leaves it to Sweep.
	StatusFailed Status = "failed"
	// StatusDead: the message failed the maximum number of attempts; it
	// is never handled again and its deliveries are dead-lettered.
	StatusDead Status = "dead"
)

// Record is the consume record of one message in one consumer group.
type Record struct {
	Group string
	ID    string
	// Status is the record's state.
	Status Status
	// Attempts counts the claims that ran (or began to run) the handler,
	// the current one included.
	Attempts int
	// Fence is +1 on every claim; Finish, Fail and Extend must present
	// the current one.
	Fence int64
	// LeaseUntil ends a processing record's lease, on the store's clock.
	LeaseUntil time.Time
	// LastError is the reason the last failed attempt gave (truncated to
	// MaxReasonLen bytes).
	LastError string
	// CreatedAt and UpdatedAt are on the store's clock.
	CreatedAt, UpdatedAt time.Time
}

// Claim is what Store.Claim answers.
type Claim struct {
	// Claimed reports that the caller now holds the record (status
	// processing) with Fence, for its Attempts-th attempt, and must
	// finish it (Finish) or fail it (Fail).
	Claimed bool
	// Status is the record's status after the call: processing when
	// claimed (or when another consumer holds a live lease), succeeded,
	// or dead.
	Status Status
	// Attempts and Fence are the record's after the call.
	Attempts int
	Fence    int64
	// LeaseUntil is the end of the record's lease and Now the store's
	// clock when it answered: an adapter that finds the record held by
	// another consumer waits about LeaseUntil - Now.
	LeaseUntil, Now time.Time
}

// Store keeps consume records, one per (group, message ID). Every
// operation is atomic in the store, and its times come from the store's
// clock. The inboxtest package pins the contract; a store is done when
// inboxtest.Run passes against a real server. Inbox validates group and
// id before it calls a Store.
type Store interface {
	// Claim takes the record of (group, id) for a new attempt, with a
	// lease: a new record, a failed one, or a processing one whose lease
	// has ended (a consumer that crashed) becomes processing, Attempts+1,
	// Fence+1, its lease ending lease after the store's now, and Claimed
	// is true. A succeeded or dead record, or a processing one whose lease
	// is live, is left as it is and reported (Claimed false). A
	// processing record whose lease ended after maxAttempts attempts
	// becomes dead instead of being claimed: its last attempt never
	// finished.
	Claim(ctx context.Context, group, id string, lease time.Duration, maxAttempts int) (Claim, error)
	// Finish marks the record succeeded if it is processing with fence
	// (its lease may have ended, if no one took it over); ErrFenced
	// otherwise.
	Finish(ctx context.Context, group, id string, fence int64) error
	// Fail ends the attempt of fence: the record becomes failed, with
	// reason, or dead if its attempts reached maxAttempts; Fail returns
	// which. ErrFenced if the record is not processing with fence.
	Fail(ctx context.Context, group, id string, fence int64, maxAttempts int, reason string) (Status, error)
	// Extend sets the lease of the processing record with fence to end
	// lease after the store's now, if that lease has not ended; ErrFenced
	// otherwise.
	Extend(ctx context.Context, group, id string, fence int64, lease time.Duration) error
	// Get returns the record of (group, id), or ErrNotFound.
	Get(ctx context.Context, group, id string) (Record, error)
	// Sweep removes up to limit (> 0) records that no delivery works on
	// any more and returns how many it removed: succeeded, dead and
	// failed records last updated more than retention ago, and processing
	// records whose lease ended more than retention ago (their consumer
	// died and the message never came back). It never removes a
	// processing record whose lease is live or ended less than retention
	// ago. A removed record is gone: a later delivery of its message
	// starts a new record (attempt 1, fence 1), and the Finish, Fail or
	// Extend of a holder of the removed one finds nothing under its fence
	// (ErrFenced) and writes nothing.
	Sweep(ctx context.Context, retention time.Duration, limit int) (int, error)
}

// TxStore is implemented by stores that can claim a record in the
// caller's SQL transaction (the sqlstore package's InboxStore), which
// HandleTx needs: the effect and the succeeded record commit together.
type TxStore interface {
	Store
	// ClaimTx is Claim for an effect that commits with the record, run in
	// tx: a record that Claim would take (new, failed, or processing past
	// its lease) gets Attempts+1 and Fence+1 and is written succeeded —
	// the state it commits in, together with the effect the caller then
	// writes in tx. Nobody sees it before tx commits: if tx rolls back
	// (the handler failed, the process died), the record is as it was.
	// Claimed is then true and Status succeeded. Otherwise the record is
	// reported as Claim reports it.
	//
	// The record's row stays locked until tx ends (on SQLite, tx holds
	// the database's write lock): a concurrent claim of the same message
	// waits, then sees what tx left.
	ClaimTx(ctx context.Context, tx *sql.Tx, group, id string, maxAttempts int) (Claim, error)
}
