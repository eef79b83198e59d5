package sqlstore

import (
	"context"
	"database/sql"
	"sync/atomic"
)

// stmtCache holds the statements of one value of the package (Store,
// InboxStore, LockBackend, OutboxStore), numbered from 0, each prepared
// on the value's *sql.DB on first use (not before: they cannot be
// prepared before Migrate created the tables). database/sql keeps a
// statement prepared on every connection that ran it, so a call parses
// nothing. It is safe for concurrent use. close closes the statements;
// every later call that needs one fails with ErrClosed.
type stmtCache struct {
	db     *sql.DB
	stmts  []atomic.Pointer[sql.Stmt]
	closed atomic.Bool
}

// newStmtCache returns an empty cache of n statements of db.
func newStmtCache(db *sql.DB, n int) *stmtCache {
	return &stmtCache{db: db, stmts: make([]atomic.Pointer[sql.Stmt], n)}
}

// isClosed reports whether close has been called.
func (c *stmtCache) isClosed() bool { return c.closed.Load() }

// close closes the cache: the statements it holds now, and any that a
// call racing with close adds later (see prepared).
func (c *stmtCache) close() {
	c.closed.Store(true)
	for i := range c.stmts {
		if st := c.stmts[i].Swap(nil); st != nil {
			_ = st.Close()
		}
	}
}

// prepared returns statement i, whose text is text, prepared on the
// cache's *sql.DB, preparing it on first use. It takes a connection from
// the pool: never call it while holding a transaction, which may hold the
// pool's only connection (sqlite.Open), or the write lock the pool's
// other connections wait for.
func (c *stmtCache) prepared(ctx context.Context, i int, text string) (*sql.Stmt, error) {
	if st := c.stmts[i].Load(); st != nil {
		return st, nil
	}
	// No lock is held while preparing: PrepareContext may wait for a
	// connection (sqlite.Open's only one, held by a transaction whose owner
	// waits for this very call to give up, as Execution.CompleteTx does
	// for a renewal it cancels), and only ctx may end that wait. Callers
	// racing on a cold statement each prepare it; one is kept.
	if c.closed.Load() {
		return nil, ErrClosed
	}
	st, err := c.db.PrepareContext(ctx, text)
	if err != nil {
		return nil, err
	}
	if !c.stmts[i].CompareAndSwap(nil, st) {
		_ = st.Close()
		if st = c.stmts[i].Load(); st == nil {
			return nil, ErrClosed // close emptied the slot meanwhile
		}
		return st, nil
	}
	// close may have emptied the cache between the check above and the
	// swap: take the statement back out, unless close took it already.
	if c.closed.Load() {
		if c.stmts[i].CompareAndSwap(st, nil) {
			_ = st.Close()
		}
		return nil, ErrClosed
	}
	return st, nil
}

// stmt returns statement i prepared on the pool when tx is nil (see
// prepared). In tx it never prepares on the pool, which would need a
// second connection while tx holds one: it returns the cached statement
// bound to tx, or nil when the statement was never prepared (the caller
// then prepares or runs the text on tx).
func (c *stmtCache) stmt(ctx context.Context, tx *sql.Tx, i int, text string) (*sql.Stmt, error) {
	if tx == nil {
		return c.prepared(ctx, i, text)
	}
	if st := c.stmts[i].Load(); st != nil {
		return tx.StmtContext(ctx, st), nil
	}
	if c.closed.Load() {
		return nil, ErrClosed
	}
	return nil, nil
}

// run runs f on statement i as stmt returns it (nil: never prepared, in
// tx). The cached statements belong to the cache's *sql.DB, and
// database/sql refuses to bind them to a transaction of another *sql.DB,
// even on the same database (the caller's own pool, say): f then runs
// again on text prepared on tx's connection. database/sql reports that
// refusal before it sends anything, so the second run is the only one
// that reaches the database.
func (c *stmtCache) run(ctx context.Context, tx *sql.Tx, i int, text string, f func(st *sql.Stmt) error) error {
	st, err := c.stmt(ctx, tx, i, text)
	if err != nil {
		return err
	}
	err = f(st)
	if tx == nil || st == nil || !foreignStmt(err) {
		return err
	}
	if st, err = tx.PrepareContext(ctx, text); err != nil {
		return err
	}
	return f(st)
}

// foreignStmt reports whether err is database/sql's refusal to bind a
// statement prepared on one *sql.DB to a transaction of another
// (Tx.StmtContext). database/sql has no sentinel for it: the message is
// the only mark, and TestCompleteTxOtherDB fails if it ever changes.
func foreignStmt(err error) bool {
	return err != nil && err.Error() == "sql: Tx.Stmt: statement from different database used"
}
