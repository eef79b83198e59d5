package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
)

// ownStatements runs the statements that a value of the package (Store,
// LockBackend, InboxStore, OutboxStore) runs outside any transaction of
// the caller's: on their
// own, under autocommit, unless the sessions of its database default to
// an isolation level above READ COMMITTED; each then runs in a
// transaction of its own begun at READ COMMITTED. That costs a BEGIN and
// a COMMIT more than autocommit, on that path only.
//
// Each of those statements is one statement, written and tested for READ
// COMMITTED: the row (a record, a lock) is the unit of concurrency. A
// statement locks its row (or inserts it, the primary key deciding
// between concurrent inserts) and its WHERE clause checks owner and
// fence on the row as it is once the lock is held; nothing it does
// relies on a snapshot older than the statement. A higher level adds
// nothing to such a statement but failures for rows it does not touch:
// under SERIALIZABLE, PostgreSQL records what an upsert read, a key
// absent from the primary key's index, as a predicate lock on the index
// page that would hold it, and every other key's insert into that page
// is a read-write conflict; two acquires of different keys (or lock
// names) that each read the page before the other inserts abort one of
// them with a serialisation failure (40001), again and again under load,
// until the caller's retries give up ("key still contended"), and the
// renewals and completions that follow fail so too. Under REPEATABLE
// READ, a statement that waited for a concurrent change of its row fails
// where READ COMMITTED would read the row again.
//
// Only such statements run so. A statement in the caller's transaction
// (Store.CompleteTx, and its read of the record; InboxStore.ClaimTx,
// FinishTx and ReviveTx; OutboxStore.Add) runs at the caller's
// isolation, and must: it commits or rolls back with the caller's
// effect, and the caller's serialisation failures (40001, which
// CompleteTx explains) stay the caller's to handle.
type ownStatements struct {
	db    *sql.DB
	d     Dialect
	cache *stmtCache
	// state: ownUnknown until the first statement, then ownAlone or
	// ownReadCommitted.
	state atomic.Int32
}

// The values of ownStatements.state.
const (
	ownUnknown int32 = iota
	ownAlone
	ownReadCommitted
)

func newOwnStatements(db *sql.DB, d Dialect, cache *stmtCache) *ownStatements {
	return &ownStatements{db: db, d: d, cache: cache}
}

// isolationDefaulter is a dialect whose sessions may default to an
// isolation level above READ COMMITTED that its single statements would
// run under (PostgreSQL's default_transaction_isolation). isolationQuery
// returns one row, the session's default level as the server spells it;
// readCommitted reports whether that level is READ COMMITTED or below;
// serializationFailure reports whether err is a serialisation failure,
// which a single statement under autocommit meets only when its session
// runs above READ COMMITTED.
type isolationDefaulter interface {
	isolationQuery() string
	readCommitted(level string) bool
	serializationFailure(err error) bool
}

// run runs f on statement i of o's cache (whose text is text), outside
// any transaction of the caller's: alone, or in a READ COMMITTED
// transaction of its own, which it commits if f succeeded or returned
// sql.ErrNoRows (as a statement under autocommit would commit).
func (o *ownStatements) run(ctx context.Context, i int, text string, f func(st *sql.Stmt) error) error {
	rc, err := o.inReadCommitted(ctx)
	if err != nil {
		return err
	}
	if !rc {
		err := o.cache.run(ctx, nil, i, text, f)
		if err != nil {
			o.sawSerializationFailure(err)
		}
		return err
	}
	// Prepare the statement before the transaction takes its connection
	// (see stmtCache.prepared).
	if _, err := o.cache.prepared(ctx, i, text); err != nil {
		return err
	}
	tx, err := o.db.BeginTx(ctx, readCommitted)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	err = runInTx(ctx, o.cache, tx, i, text, f)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	if cerr := tx.Commit(); cerr != nil {
		return cerr
	}
	return err
}

// runInTx runs f on statement i of c bound to tx, preparing text on tx's
// own connection when c never prepared it (see stmtCache.run).
func runInTx(ctx context.Context, c *stmtCache, tx *sql.Tx, i int, text string, f func(st *sql.Stmt) error) error {
	return c.run(ctx, tx, i, text, func(st *sql.Stmt) error {
		if st == nil {
			var err error
			if st, err = tx.PrepareContext(ctx, text); err != nil {
				return err
			}
		}
		return f(st)
	})
}

// inReadCommitted reports whether the statements run in a READ COMMITTED
// transaction of their own: whether the sessions of the database default
// to a higher isolation level (asked once, on the first statement; an
// error is returned and asked again next time). The default is a setting
// of the database, the role or the connection string, the same on every
// connection of the pool. A session that differs (the default changed
// after the probe, or SET SESSION CHARACTERISTICS run on a connection of
// the pool) is found out by the first serialisation failure of a
// statement run alone there (see sawSerializationFailure).
func (o *ownStatements) inReadCommitted(ctx context.Context) (bool, error) {
	switch o.state.Load() {
	case ownAlone:
		return false, nil
	case ownReadCommitted:
		return true, nil
	}
	d, ok := o.d.(isolationDefaulter)
	if !ok {
		o.state.Store(ownAlone)
		return false, nil
	}
	var level string
	if err := o.db.QueryRowContext(ctx, d.isolationQuery()).Scan(&level); err != nil {
		return false, fmt.Errorf("read the default isolation level: %w", err)
	}
	if d.readCommitted(level) {
		o.state.CompareAndSwap(ownUnknown, ownAlone)
		return false, nil
	}
	o.state.Store(ownReadCommitted)
	return true, nil
}

// sawSerializationFailure switches to READ COMMITTED transactions when
// err, the error of a statement run alone, is a serialisation failure:
// its session runs above READ COMMITTED although the probe saw READ
// COMMITTED (the database's or role's default changed after the probe
// and new connections have it, or a caller ran SET SESSION
// CHARACTERISTICS on a connection of the pool). The statement was rolled
// back; the callers' retries run it again, wrapped. The switch is never
// undone: wrapping is right at every level, only a round trip dearer.
func (o *ownStatements) sawSerializationFailure(err error) {
	if d, ok := o.d.(isolationDefaulter); ok && d.serializationFailure(err) {
		o.state.Store(ownReadCommitted)
	}
}

// statementSet runs the statements of a value of the package that keeps
// its own statement cache (InboxStore, StepJournal): statement i (whose
// text and parameters query(i) gives) with its arguments taken from v.
// In tx, a statement not yet prepared comes as nil: never prepare on the
// pool while holding a transaction (SQLite's only connection may be
// tx's); the text runs on tx (pgx prepares it once per connection by
// itself). Outside a transaction (tx nil), the statement runs as
// ownStatements runs it: alone, under autocommit, or in a READ COMMITTED
// transaction of its own when the sessions default to a higher level
// (distinct keys would otherwise fail each other under SERIALIZABLE).
type statementSet struct {
	cache *stmtCache
	own   *ownStatements
	query func(i int) *query
}

func newStatementSet(db *sql.DB, d Dialect, n int, query func(i int) *query) statementSet {
	c := newStmtCache(db, n)
	return statementSet{cache: c, own: newOwnStatements(db, d, c), query: query}
}

func (s statementSet) run(ctx context.Context, tx *sql.Tx, i int, v *values, f func(st *sql.Stmt, args []any) error) error {
	q := s.query(i)
	args := q.args(v)
	g := func(st *sql.Stmt) error { return f(st, args) }
	if tx == nil {
		return s.own.run(ctx, i, q.text, g)
	}
	return s.cache.run(ctx, tx, i, q.text, g)
}

func (s statementSet) exec(ctx context.Context, tx *sql.Tx, i int, v *values) (sql.Result, error) {
	var res sql.Result
	err := s.run(ctx, tx, i, v, func(st *sql.Stmt, args []any) (err error) {
		if st == nil {
			res, err = tx.ExecContext(ctx, s.query(i).text, args...)
		} else {
			res, err = st.ExecContext(ctx, args...)
		}
		return err
	})
	return res, err
}

func (s statementSet) queryRow(ctx context.Context, tx *sql.Tx, i int, v *values, dest ...any) error {
	return s.run(ctx, tx, i, v, func(st *sql.Stmt, args []any) error {
		if st == nil {
			return tx.QueryRowContext(ctx, s.query(i).text, args...).Scan(dest...)
		}
		return st.QueryRowContext(ctx, args...).Scan(dest...)
	})
}

// queryRows runs statement i and calls row for each row.
func (s statementSet) queryRows(ctx context.Context, tx *sql.Tx, i int, v *values, row func(*sql.Rows) error) error {
	return s.run(ctx, tx, i, v, func(st *sql.Stmt, args []any) error {
		var rows *sql.Rows
		var err error
		if st == nil {
			rows, err = tx.QueryContext(ctx, s.query(i).text, args...)
		} else {
			rows, err = st.QueryContext(ctx, args...)
		}
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := row(rows); err != nil {
				return err
			}
		}
		return rows.Err()
	})
}
