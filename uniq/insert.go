package uniq

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
)

// DefaultAttempts is how many times InsertOrGet tries the insert when the
// duplicate it met cannot be read back and the Querier is not a
// transaction.
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

	// ErrUnresolved matches an *UnresolvedError: the insert met a
	// duplicate, but the get found no row.
	ErrUnresolved = errors.New("uniq: duplicate key, but no row found")
)

// UnresolvedError is returned by InsertOrGet when the insert was refused as
// a duplicate and the get then found nothing, as many times as it tried.
// It is never a success: the value the caller asked for may not exist.
//
// The causes, most likely first: the insert collided on another unique
// constraint than the one get reads by (a unique email on a users table
// that get reads by username); the row was deleted between the insert and
// the get (on a *sql.DB InsertOrGet tries again first); get cannot see the
// row because it reads an older snapshot (a transaction in REPEATABLE READ
// or SERIALIZABLE that started before the row was committed — on MySQL and
// MariaDB, whose default is REPEATABLE READ, after any earlier plain read
// in the transaction).
//
// errors.Is(err, ErrUnresolved) holds, and so does IsDuplicate(err): it
// wraps the insert's duplicate-key error.
type UnresolvedError struct {
	// Attempts is how many times the insert was tried.
	Attempts int
	// Tx reports whether the Querier was a transaction (a *sql.Tx, or a
	// type with its Commit and Rollback methods): no retry is made in a
	// transaction, whose snapshot would not change.
	Tx bool
	// Err is the last insert's duplicate-key error.
	Err error
}

// Error says what happened and what may have caused it.
func (e *UnresolvedError) Error() string {
	where := "after " + strconv.Itoa(e.Attempts) + " attempts"
	if e.Tx {
		where = "in a transaction"
	}
	return "uniq: insert found a duplicate, but get found no row " + where +
		" (another unique constraint, a row deleted meanwhile, or a snapshot that cannot see it): " + e.Err.Error()
}

// Unwrap returns ErrUnresolved and the insert's error.
func (e *UnresolvedError) Unwrap() []error { return []error{ErrUnresolved, e.Err} }

// Config tunes InsertOrGetConfig. The zero value (and nil) means the
// defaults.
type Config struct {
	// Attempts is how many times the insert is tried, at most, when it
	// meets a duplicate that get then cannot find, on a Querier that is not
	// a transaction. Zero means DefaultAttempts (3). In a transaction the
	// insert is tried once.
	Attempts int
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
// When get finds nothing after a duplicate, InsertOrGet tries again (up to
// DefaultAttempts inserts) unless q is a transaction, and then returns an
// *UnresolvedError. Any other error of insert or get is returned as it is,
// wrapped. In a transaction, when the ROLLBACK TO SAVEPOINT after a failed
// insert fails too (MySQL rolls a deadlock's victim back whole, savepoint
// included), the error wraps both the insert's error and the rollback's,
// no get runs, and the transaction is no longer usable: retry it whole.
func InsertOrGet[T any](ctx context.Context, q Querier,
	insert func(ctx context.Context, q Querier) (T, error),
	get func(ctx context.Context, q Querier) (T, error),
) (v T, created bool, err error) {
	return InsertOrGetConfig(ctx, q, nil, insert, get)
}

// InsertOrGetConfig is InsertOrGet with a Config; nil means the defaults.
func InsertOrGetConfig[T any](ctx context.Context, q Querier, cfg *Config,
	insert func(ctx context.Context, q Querier) (T, error),
	get func(ctx context.Context, q Querier) (T, error),
) (v T, created bool, err error) {
	var zero T
	if insert == nil || get == nil {
		return zero, false, errors.New("uniq: InsertOrGet needs an insert and a get function")
	}
	attempts := DefaultAttempts
	if cfg != nil && cfg.Attempts > 0 {
		attempts = cfg.Attempts
	}
	inTx := isTx(q)
	if inTx {
		attempts = 1
	}
	var dup error
	for range attempts {
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
	}
	return zero, false, &UnresolvedError{Attempts: attempts, Tx: inTx, Err: dup}
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
