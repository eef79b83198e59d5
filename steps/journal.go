package steps

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/idemkit/idem"
)

// State is where an operation stands in its journal.
type State string

// The states of an operation.
const (
	// StateRunning: an execution began it and has not ended it. If that
	// execution died (a crash, a lost lease), the completer takes the
	// operation up after NextAt.
	StateRunning State = "running"
	// StateWaiting: its last attempt failed with a retryable error; the
	// completer tries again after NextAt (or a client's retry does sooner).
	StateWaiting State = "waiting"
	// StateDone: its answer is stored in its idempotency record. Kept for
	// the record's retention, then swept.
	StateDone State = "done"
	// StateDead: it failed MaxAttempts times, or cannot be resumed; the
	// completer leaves it to an operator (Runner.Retry), and a client's
	// retry still runs it.
	StateDead State = "dead"
)

// Entry is an operation as its journal holds it.
type Entry struct {
	Scope, Key string
	// Name is the operation's name (Define's), which the completer looks
	// the function up by.
	Name string
	// Fingerprint is the idempotency record's: the completer acquires the
	// key with it.
	Fingerprint idem.Fingerprint
	// Input is the operation's input, as its codec encoded it.
	Input    []byte
	State    State
	Attempts int
	// NextAt is when the completer may take the operation up (zero once
	// done or dead).
	NextAt time.Time
	// LastError is the text of the last attempt's error ("" if none).
	LastError string
	CreatedAt time.Time
	UpdatedAt time.Time
	// ExpiresAt is when a done operation may be swept (zero before).
	ExpiresAt time.Time
	// Checkpoints are the steps done, in the order they were saved; Get
	// fills them, Due and List do not.
	Checkpoints []Checkpoint
}

// Checkpoint is one step's saved result.
type Checkpoint struct {
	Step   string
	Result []byte
	At     time.Time
}

// Start is what Journal.Begin records of an operation.
type Start struct {
	Name        string
	Fingerprint idem.Fingerprint
	Input       []byte
	// After is how long from now the completer waits before it takes the
	// operation up, should this execution end without a word (a crash).
	After time.Duration
}

// Resumed is what Journal.Begin found.
type Resumed struct {
	// Checkpoints are the results of the steps done, by step name: the
	// operation's own, from earlier attempts under the same fingerprint.
	Checkpoints map[string][]byte
	// Attempt is this attempt's number: 1 for the first.
	Attempt int
}

// Failure is a failed attempt, for Journal.Fail.
type Failure struct {
	Reason string
	// Backoff is how long from now the completer waits before the next
	// attempt.
	Backoff time.Duration
	// MaxAttempts: an operation that failed this many attempts is dead.
	MaxAttempts int
}

// Journal keeps operations and their checkpoints. Every write made for
// an execution (Begin, Save, Fail, Finish) is fenced by its lease: it is
// refused with idem.ErrLeaseLost unless the idempotency record is held
// by that lease's owner and fence, checked atomically with the write, so
// that an execution whose key was taken over cannot checkpoint, fail or
// finish the operation that another now runs. The other writes are the
// completer's and the operator's scheduling (Postpone, Settle, Retry,
// Sweep), which never touch a checkpoint of a running operation.
//
// stepstest.Run is the suite a Journal passes. sqlstore.StepJournal keeps
// operations in the database of the idempotency records, so that a local
// step's writes, its checkpoint and the fence check commit in one
// transaction; Memory keeps them in the process.
type Journal interface {
	// Begin records that the lease l runs the operation s and returns
	// the checkpoints saved for it. A done operation of the key (its
	// record expired, and the key is used again) is replaced, its
	// checkpoints dropped. One not done with another name or fingerprint
	// (the key was released after a failed attempt and is reused by
	// another request) is refused with an error matching
	// idem.ErrMismatch, and kept: its steps may be half done, and a
	// retry of its own request, or the completer, is to finish it. The
	// operation becomes running, with one more attempt, and NextAt
	// s.After from now.
	Begin(ctx context.Context, l idem.Lease, s Start) (Resumed, error)
	// Save saves step's result. A step saved already is an error.
	Save(ctx context.Context, l idem.Lease, step string, result []byte) error
	// Fail records a failed attempt: the operation waits f.Backoff, or is
	// dead once it has used f.MaxAttempts. It returns the new state.
	Fail(ctx context.Context, l idem.Lease, f Failure) (State, error)
	// Finish marks the operation done, to be swept after retention, and
	// drops its checkpoints. l must be the lease that completed the
	// record, or that holds it and completes it after.
	Finish(ctx context.Context, l idem.Lease, retention time.Duration) error

	// Due returns up to limit operations named name, running or waiting,
	// whose NextAt has come, earliest first. (A completer asks for the
	// operations it can run: others in the same tables, another
	// service's, are not its business.)
	Due(ctx context.Context, name string, limit int) ([]Entry, error)
	// Postpone moves a running or waiting operation's NextAt to d from
	// now (the completer found it in flight).
	Postpone(ctx context.Context, scope, key string, d time.Duration) error
	// Settle ends the operation seen, as Due (or Get) returned it, that
	// the completer found ended elsewhere: done (its record was completed
	// under its key), or dead with reason (it cannot be resumed). It
	// changes nothing unless the operation is still as seen (its
	// fingerprint, state and attempts) and not done: the completer
	// decided from seen, and an operator's Retry or another attempt
	// since then must stand. Done operations are kept for retention.
	Settle(ctx context.Context, seen Entry, state State, reason string, retention time.Duration) error
	// Get returns the operation with its checkpoints, or idem.ErrNotFound.
	Get(ctx context.Context, scope, key string) (Entry, error)
	// List returns up to limit operations in state, least recently
	// updated first.
	List(ctx context.Context, state State, limit int) ([]Entry, error)
	// Retry makes a dead or waiting operation due now, a dead one with
	// its attempts counted from 0 again. idem.ErrNotFound if there is no
	// such operation; ErrNotRetryable if it is running or done.
	Retry(ctx context.Context, scope, key string) error
	// Sweep deletes up to limit done operations whose retention ended,
	// and returns how many.
	Sweep(ctx context.Context, limit int) (int, error)
}

// TxJournal is a Journal in a SQL database, which runs local steps: the
// step's writes, its checkpoint and the fence check commit in one
// transaction.
type TxJournal interface {
	Journal
	// BeginTx begins a transaction for a local step on the journal's
	// database (READ COMMITTED where the database has levels; on SQLite
	// a write transaction).
	BeginTx(ctx context.Context) (*sql.Tx, error)
	// SaveTx is Save in tx: the checkpoint commits with tx, and only
	// while l holds the record (the check locks the record's row until
	// tx ends).
	SaveTx(ctx context.Context, tx *sql.Tx, l idem.Lease, step string, result []byte) error
	// FinishTx is Finish in tx, before the record's completion in the
	// same transaction.
	FinishTx(ctx context.Context, tx *sql.Tx, l idem.Lease, retention time.Duration) error
}

// ErrNotRetryable is Retry's answer for an operation that is running or
// done.
var ErrNotRetryable = errors.New("steps: the operation is running or done: nothing to retry")

// ErrStepSaved is Save's answer for a step saved already.
var ErrStepSaved = errors.New("steps: step saved already")
