package uniq

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
)

// DefaultAttempts is how many times InsertOrGet tries the insert, at
// most, when the duplicate it met cannot be read back (see [Attempts]).
const DefaultAttempts = 3

// A Querier runs statements: *sql.DB, *sql.Tx and *sql.Conn implement it.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Sentinel errors. Match them with errors.Is.
var (
	// ErrNotFound is what a get function may return when it finds no row;
	// sql.ErrNoRows (what Row.Scan returns) means the same to InsertOrGet.
	ErrNotFound = errors.New("uniq: not found")

	// ErrNotVisible matches a *NotVisibleError: the insert met a
	// duplicate that the transaction's snapshot cannot see. Retry the
	// whole transaction.
	ErrNotVisible = errors.New("uniq: duplicate key, but the row is not visible to the transaction's snapshot")

	// ErrUnresolved matches an *UnresolvedError: the insert met a
	// duplicate that get cannot find although it can see every committed
	// row. It is a bug of the caller's (another unique constraint fired,
	// or get does not read by the key the insert collides on), not a
	// condition a retry resolves.
	ErrUnresolved = errors.New("uniq: duplicate key, but no row found")
)

// NotVisibleError is returned by InsertOrGet in a PostgreSQL transaction
// whose isolation is REPEATABLE READ or SERIALIZABLE when the insert was
// refused as a duplicate and get found nothing: the row was committed
// after the transaction's snapshot, so no statement of this transaction
// can read it. Roll back and run the whole transaction again; its new
// snapshot sees the row. A retry loop should classify it as retryable,
// like a serialisation failure (40001). errors.Is(err, ErrNotVisible)
// holds, and so does IsDuplicate(err): it wraps the insert's error.
//
// Such a snapshot cannot tell that cause from a collision on another
// unique constraint than the one get reads by: if the retried transaction
// meets a NotVisibleError again, suspect that.
type NotVisibleError struct {
	// Isolation is the transaction's isolation, as PostgreSQL names it
	// ("repeatable read", "serializable").
	Isolation string
	// Err is the insert's duplicate-key error.
	Err error
}

// Error says what happened and what to do.
func (e *NotVisibleError) Error() string {
	return "uniq: insert found a duplicate that the transaction (" + e.Isolation +
		") cannot see: it was committed after the snapshot; retry the transaction: " + e.Err.Error()
}

// Unwrap returns ErrNotVisible and the insert's error.
func (e *NotVisibleError) Unwrap() []error { return []error{ErrNotVisible, e.Err} }

// UnresolvedError is returned by InsertOrGet when the insert was refused as
// a duplicate and get then found nothing, as many times as it tried, where
// get sees every committed row (outside a transaction; in a transaction
// at READ COMMITTED, on MySQL/MariaDB or SQLite). It is never a success:
// the value the caller asked for may not exist, and retrying will not
// change that.
//
// The causes, most likely first: the insert collided on another unique
// constraint than the one get reads by (a unique email on a users table
// that get reads by username); get does not read by the key the insert
// collides on; in a MySQL/MariaDB transaction, get is a plain read, which
// sees the transaction's snapshot (use LOCK IN SHARE MODE or FOR SHARE);
// the row was deleted between each insert and its get.
//
// errors.Is(err, ErrUnresolved) holds, and so does IsDuplicate(err): it
// wraps the insert's duplicate-key error.
type UnresolvedError struct {
	// Attempts is how many times the insert was tried.
	Attempts int
	// Tx reports whether the Querier was a transaction (a *sql.Tx, or a
	// type with its Commit and Rollback methods).
	Tx bool
	// Err is the last insert's duplicate-key error.
	Err error
}

// Error says what happened and what may have caused it.
func (e *UnresolvedError) Error() string {
	where := "after " + strconv.Itoa(e.Attempts) + " attempts"
	if e.Tx {
		where += " in a transaction"
	}
	return "uniq: insert found a duplicate, but get found no row " + where +
		" (another unique constraint, a get that does not read by that key or reads an old snapshot, or a row deleted meanwhile): " + e.Err.Error()
}

// Unwrap returns ErrUnresolved and the insert's error.
func (e *UnresolvedError) Unwrap() []error { return []error{ErrUnresolved, e.Err} }

// An Option changes one call of InsertOrGet.
type Option func(*options)

// options are a call's options.
type options struct {
	attempts int
	err      error
}

// Attempts sets how many times the insert is tried, at most, when it
// meets a duplicate that get then cannot find (n ≥ 1; DefaultAttempts
// without it). Each new try runs insert and get again: a row deleted
// meanwhile is then created. In a transaction each try runs in its own
// savepoint; in a PostgreSQL transaction at REPEATABLE READ or
// SERIALIZABLE no new try is made (the snapshot would not change): the
// answer is a NotVisibleError. n < 1 makes InsertOrGet fail.
func Attempts(n int) Option {
	return func(o *options) {
		if n < 1 {
			o.err = fmt.Errorf("uniq: Attempts(%d): at least 1", n)
			return
		}
		o.attempts = n
	}
}

// InsertOrGet runs insert and, if it fails with a duplicate key
// (IsDuplicate), runs get: it returns the row that was created
// (created = true) or the one that was already there (created = false).
// It never selects first: of any number of concurrent calls on one key,
// the database's unique index picks the one that creates the row, and the
// others read it. A duplicate is success for the caller.
//
// insert and get receive the ctx and q that InsertOrGet was given. insert
// must be one statement (an INSERT … RETURNING, or an INSERT and no more)
// so that a duplicate means nothing was written; get must read the row by
// the same unique key the insert collides on, and return sql.ErrNoRows or
// ErrNotFound (possibly wrapped) when there is none.
//
// When q is a transaction — a *sql.Tx, or a type of its own with the
// Commit() error and Rollback() error methods of one, as the transactions
// of sqlx and of tracing wrappers have — insert runs inside a SAVEPOINT,
// rolled back on any error of insert and released otherwise: on
// PostgreSQL a failed statement aborts the whole transaction, and the
// savepoint keeps it usable, so the transaction still commits after a
// duplicate. On MySQL/MariaDB in a
// transaction, get should use a locking read (SELECT … LOCK IN SHARE MODE,
// or FOR SHARE) so that it reads the latest committed row rather than the
// transaction's snapshot. On a *sql.Conn no savepoint is made: a Conn is
// assumed to be in autocommit mode (use Conn.BeginTx and pass the *sql.Tx
// otherwise).
//
// When get finds nothing after a duplicate:
//
//   - in a PostgreSQL transaction at REPEATABLE READ or SERIALIZABLE (read
//     with current_setting('transaction_isolation')), the row is not
//     visible to the snapshot: a *NotVisibleError, errors.Is
//     ErrNotVisible — retry the whole transaction;
//   - otherwise InsertOrGet tries again (insert, then get), up to
//     DefaultAttempts inserts ([Attempts] changes it), and then returns
//     an *UnresolvedError, errors.Is ErrUnresolved — a bug to fix, not a
//     condition to retry.
//
// Any other error of insert or get is returned as it is, wrapped. In a
// transaction, when the ROLLBACK TO SAVEPOINT after a failed insert fails
// too (MySQL rolls a deadlock's victim back whole, savepoint included),
// the error wraps both the insert's error and the rollback's, no get
// runs, and the transaction is no longer usable: retry it whole.
func InsertOrGet[T any](ctx context.Context, q Querier,
	insert func(ctx context.Context, q Querier) (T, error),
	get func(ctx context.Context, q Querier) (T, error),
	opts ...Option,
) (v T, created bool, err error) {
	var zero T
	if insert == nil || get == nil {
		return zero, false, errors.New("uniq: InsertOrGet needs an insert and a get function")
	}
	o := options{attempts: DefaultAttempts}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.err != nil {
		return zero, false, o.err
	}
	inTx := isTx(q)
	var dup error
	for range o.attempts {
		v, err = tryInsert(ctx, q, inTx, insert)
		if err == nil {
			return v, true, nil
		}
		var rb *rollbackError
		if errors.As(err, &rb) || !IsDuplicate(err) {
			return zero, false, fmt.Errorf("uniq: insert: %w", withCause(ctx, err))
		}
		dup = err
		v, err = get(ctx, q)
		if err == nil {
			return v, false, nil
		}
		if !errorsIsAny(err, sql.ErrNoRows, ErrNotFound) {
			return zero, false, fmt.Errorf("uniq: get after a duplicate: %w", withCause(ctx, err))
		}
		if ctx.Err() != nil {
			return zero, false, context.Cause(ctx)
		}
		if inTx && isPostgres(dup) {
			iso, err := snapshotIsolation(ctx, q)
			if err != nil {
				return zero, false, fmt.Errorf("uniq: get found no row after a duplicate (%w), and reading the transaction's isolation failed: %w", dup, withCause(ctx, err))
			}
			if iso != "" {
				return zero, false, &NotVisibleError{Isolation: iso, Err: dup}
			}
		}
	}
	return zero, false, &UnresolvedError{Attempts: o.attempts, Tx: inTx, Err: dup}
}

// snapshotIsolation returns the isolation of PostgreSQL transaction q
// when it reads one snapshot for the whole transaction ("repeatable
// read", "serializable"), and "" at READ COMMITTED (and READ
// UNCOMMITTED, the same in PostgreSQL), where each statement sees every
// row committed before it.
func snapshotIsolation(ctx context.Context, q Querier) (string, error) {
	var iso string
	if err := q.QueryRowContext(ctx, "SELECT current_setting('transaction_isolation')").Scan(&iso); err != nil {
		return "", err
	}
	switch iso {
	case "repeatable read", "serializable":
		return iso, nil
	}
	return "", nil
}

// savepoints numbers the savepoints, so that nested calls in one
// transaction never share a name.
var savepoints atomic.Uint64

// tryInsert runs insert, in a savepoint when inTx.
func tryInsert[T any](ctx context.Context, q Querier, inTx bool, insert func(context.Context, Querier) (T, error)) (T, error) {
	if !inTx {
		return insert(ctx, q)
	}
	var zero T
	name := "idem_uniq_" + strconv.FormatUint(savepoints.Add(1), 10)
	if _, err := q.ExecContext(ctx, "SAVEPOINT "+name); err != nil {
		return zero, fmt.Errorf("savepoint: %w", err)
	}
	v, err := insert(ctx, q)
	if err != nil {
		// context.WithoutCancel: a cancelled ctx ends the transaction
		// anyway (database/sql rolls it back), and otherwise the rollback
		// must run for the transaction to stay usable.
		// A failed rollback leaves the transaction unusable: both errors
		// are returned, and no get runs (see rollbackError).
		if _, rerr := q.ExecContext(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT "+name); rerr != nil {
			return zero, &rollbackError{err: err, rollback: rerr}
		}
		return zero, err
	}
	if _, err := q.ExecContext(ctx, "RELEASE SAVEPOINT "+name); err != nil {
		return zero, fmt.Errorf("release savepoint: %w", err)
	}
	return v, nil
}

// rollbackError is an insert's error in a transaction whose ROLLBACK TO
// SAVEPOINT failed too: the transaction is not usable any more (MySQL
// rolls a deadlock's victim back whole, savepoint included). It wraps
// both, so that the insert's error (the deadlock a caller retries the
// transaction on, the cancelled context) stays visible to errors.Is and
// errors.As; no get runs after it, even when the insert's error is a
// duplicate.
type rollbackError struct {
	err, rollback error
}

func (e *rollbackError) Error() string {
	return e.err.Error() + " (and rollback to savepoint: " + e.rollback.Error() + ")"
}

func (e *rollbackError) Unwrap() []error { return []error{e.err, e.rollback} }

// withCause adds ctx's cause to err when ctx is done and err does not say
// so already: lib/pq answers a cancelled statement with its own error
// (SQLSTATE 57014), which errors.Is does not take for context.Canceled.
func withCause(ctx context.Context, err error) error {
	if ctx.Err() == nil || errors.Is(err, ctx.Err()) {
		return err
	}
	return fmt.Errorf("%w (%w)", err, context.Cause(ctx))
}

// isTx reports whether q is a transaction: a *sql.Tx, or a wrapper of one
// (sqlx's *Tx embeds it) that has its Commit and Rollback methods, which
// *sql.DB and *sql.Conn do not have.
func isTx(q Querier) bool {
	if _, ok := q.(*sql.Tx); ok {
		return true
	}
	_, ok := q.(interface {
		Commit() error
		Rollback() error
	})
	return ok
}
