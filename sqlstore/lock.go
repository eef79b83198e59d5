package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/idemkit/idem/lock"
)

// lockStatements are the statements of LockBackend, in the block of
// queries/NAME.sql whose names start with "lock_".
type lockStatements struct {
	acquire *query
	extend  *query
	release *query
}

func (st *lockStatements) byName() map[string]**query {
	return map[string]**query{
		"lock_acquire": &st.acquire,
		"lock_extend":  &st.extend,
		"lock_release": &st.release,
	}
}

// The LockBackend's statements, as indexes into its statement cache.
const (
	lockAcquire = iota
	lockExtend
	lockRelease
	numLockQueries
)

func (st *lockStatements) query(i int) *query {
	return [...]*query{lockAcquire: st.acquire, lockExtend: st.extend, lockRelease: st.release}[i]
}

// lockAcquireAttempts bounds how often Acquire, Extend and Release run
// their statement after a deadlock or a serialisation failure.
const lockAcquireAttempts = 5

// LockBackend is a [lock.Backend] in the database: the table idem_locks
// (created by Store.Migrate, or LockBackend.Migrate) holds a row per
// lock name with its owner, fence and lease. The fence comes from that
// row (+1 on every acquisition) and survives release and expiry (release
// clears the owner and keeps the row); the lease is counted on the
// database's clock. Every operation is one statement, run again (at most
// 5 times) after a deadlock or a serialisation failure. As the Store's
// own statements, it runs in a READ COMMITTED transaction of its own
// when the sessions default to REPEATABLE READ or SERIALIZABLE
// (PostgreSQL), where acquires of distinct names would otherwise fail
// each other with serialisation failures. It is safe for concurrent use,
// also by several processes sharing the database.
//
// Lock names are compared byte for byte ("a", "A" and "a " are three
// locks). The rows are never deleted: lock names should come from a
// bounded set.
type LockBackend struct {
	db      *sql.DB
	d       Dialect
	cfg     Config // a copy of NewLockBackend's
	st      *lockStatements
	cache   *stmtCache
	own     *ownStatements
	cleanup runtime.Cleanup
}

var _ lock.Backend = (*LockBackend)(nil)

// NewLockBackend returns a LockBackend over db. cfg is required (for its
// Dialect) and is copied; its Logger receives the migrations Migrate
// applies. It does not touch the database: run Migrate (the Store's or
// the LockBackend's) before first use.
func NewLockBackend(db *sql.DB, cfg *Config) (*LockBackend, error) {
	if db == nil {
		return nil, errors.New("sqlstore: NewLockBackend: nil *sql.DB")
	}
	if cfg == nil || cfg.Dialect == nil {
		return nil, errors.New("sqlstore: NewLockBackend: Config.Dialect is required (e.g. sqlstore.PostgreSQL)")
	}
	c := *cfg
	b := &LockBackend{db: db, d: c.Dialect, cfg: c, st: &c.Dialect.statements().lock, cache: newStmtCache(db, numLockQueries)}
	b.own = newOwnStatements(db, c.Dialect, b.cache)
	b.cleanup = runtime.AddCleanup(b, (*stmtCache).close, b.cache)
	return b, nil
}

// Migrate applies the package's migrations, idem_locks among them: the
// same as Store.Migrate.
func (b *LockBackend) Migrate(ctx context.Context) error {
	s, err := New(b.db, &b.cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	return s.Migrate(ctx)
}

// Close closes the statements the LockBackend prepared on its *sql.DB
// (not the *sql.DB, which is the caller's). Calls made after Close fail
// with ErrClosed. It is idempotent and returns nil.
func (b *LockBackend) Close() error {
	b.cleanup.Stop()
	b.cache.close()
	return nil
}

// run runs f on statement i, alone or, when the sessions default to an
// isolation level above READ COMMITTED, in a READ COMMITTED transaction
// of its own (see ownStatements: distinct names would otherwise fail
// each other under SERIALIZABLE).
func (b *LockBackend) run(ctx context.Context, i int, f func(st *sql.Stmt) error) error {
	return b.own.run(ctx, i, b.st.query(i).text, f)
}

// leaseMS is the lease the statements write for ttl: whole milliseconds
// rounded up, plus one for the database's "now", which is truncated to
// the millisecond; so the lease never ends before ttl has passed since
// the statement began.
func leaseMS(ttl time.Duration) int64 {
	ms := int64((ttl + time.Millisecond - 1) / time.Millisecond)
	return ms + 1
}

func (b *LockBackend) fail(ctx context.Context, op, name string, err error) error {
	if b.cache.isClosed() && !errors.Is(err, ErrClosed) {
		return fmt.Errorf("%w (lock %s %q: %v)", ErrClosed, op, name, err)
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("sqlstore: lock %s %q: %w (%v)", op, name, cerr, err)
	}
	if b.d.missingTable(err) {
		return fmt.Errorf("sqlstore: lock %s %q: %w (has Migrate run?)", op, name, err)
	}
	return fmt.Errorf("sqlstore: lock %s %q: %w", op, name, err)
}

// Acquire implements lock.Backend: one upsert that inserts the name's
// row, or takes it if it is free (released or past its lease) with fence
// + 1; it reports ErrHeld when the row is another's. PostgreSQL and
// SQLite return the fence (RETURNING); MySQL reports it as the
// statement's insert id (LAST_INSERT_ID(expr), see queries/mysql.sql).
func (b *LockBackend) Acquire(ctx context.Context, name, owner string, ttl time.Duration) (int64, error) {
	const op = "acquire"
	if err := lock.ValidateName(name); err != nil {
		return 0, err
	}
	if owner == "" || ttl <= 0 {
		return 0, fmt.Errorf("sqlstore: lock acquire %q: empty owner or TTL %v", name, ttl)
	}
	v := values{name: name, owner: owner, leaseMS: leaseMS(ttl)}
	args := b.st.acquire.args(&v)
	for attempt := 1; ; attempt++ {
		var fence int64
		err := b.run(ctx, lockAcquire, func(st *sql.Stmt) error {
			if b.d.completeReturns() {
				return st.QueryRowContext(ctx, args...).Scan(&fence)
			}
			res, err := st.ExecContext(ctx, args...)
			if err == nil {
				fence, err = res.LastInsertId()
			}
			return err
		})
		switch {
		case errors.Is(err, sql.ErrNoRows), err == nil && fence == 0:
			return 0, lock.ErrHeld
		case err == nil:
			return fence, nil
		}
		if !b.d.retryable(err) || attempt == lockAcquireAttempts || ctx.Err() != nil {
			return 0, b.fail(ctx, op, name, err)
		}
	}
}

// Extend implements lock.Backend: an UPDATE of the row when it carries
// owner and fence and its lease has not ended.
func (b *LockBackend) Extend(ctx context.Context, name, owner string, fence int64, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("sqlstore: lock extend %q: TTL %v", name, ttl)
	}
	return b.update(ctx, "extend", lockExtend, values{name: name, owner: owner, fence: fence, leaseMS: leaseMS(ttl)})
}

// Release implements lock.Backend: an UPDATE that clears the owner of
// the row when it carries owner and fence and its lease has not ended;
// the row, and so the fence, stays.
func (b *LockBackend) Release(ctx context.Context, name, owner string, fence int64) error {
	return b.update(ctx, "release", lockRelease, values{name: name, owner: owner, fence: fence})
}

// update runs Extend's or Release's statement: one matched row, or
// ErrNotHeld. A deadlock or a serialisation failure is retried, as
// Acquire does. On MySQL, which counts changed rows rather than matched
// ones, the extend statement reports a match as its insert id
// (LAST_INSERT_ID(expr)) and the release statement always changes the
// row it matches.
func (b *LockBackend) update(ctx context.Context, op string, i int, v values) error {
	if owner := v.owner; owner == "" || v.fence < 1 {
		return lock.ErrNotHeld
	}
	args := b.st.query(i).args(&v)
	var (
		res sql.Result
		err error
	)
	for attempt := 1; ; attempt++ {
		// A serialisation failure (PostgreSQL, not expected: the
		// statement runs at READ COMMITTED whatever the sessions' default,
		// see ownStatements) or a deadlock rolled the statement back: a
		// new snapshot sees the row as the change left it.
		if err = b.run(ctx, i, func(st *sql.Stmt) (err error) {
			res, err = st.ExecContext(ctx, args...)
			return err
		}); err == nil {
			break
		}
		if !b.d.retryable(err) || attempt == lockAcquireAttempts || ctx.Err() != nil {
			return b.fail(ctx, op, v.name, err)
		}
	}
	var n int64
	if i == lockExtend && !b.d.completeReturns() {
		n, err = res.LastInsertId()
	} else {
		n, err = res.RowsAffected()
	}
	if err != nil {
		return b.fail(ctx, op, v.name, err)
	}
	if n == 0 {
		return lock.ErrNotHeld
	}
	return nil
}
