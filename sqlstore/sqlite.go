package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver used by OpenSQLite
)

// SQLite is the dialect of SQLite 3.42 or later (modernc.org/sqlite or any
// other driver). Open the database with [OpenSQLite], or with the settings
// it documents: WAL, a busy timeout of seconds, and IMMEDIATE transactions.
var SQLite Dialect = sqliteDialect{}

type sqliteDialect struct{}

var sqliteStatements, sqliteMigrations = mustLoad("sqlite")

func (sqliteDialect) String() string          { return "sqlite" }
func (sqliteDialect) statements() *statements { return sqliteStatements }
func (sqliteDialect) migrations() []migration { return sqliteMigrations }

// missingTable: a missing table, or a missing column (took_over comes
// with migration 2: a database migrated by an older build).
func (sqliteDialect) missingTable(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "no such table") || strings.Contains(msg, "no such column") || strings.Contains(msg, "has no column named")
}
func (sqliteDialect) completeReturns() bool    { return true }
func (sqliteDialect) acquireMode() acquireMode { return acquireInTx }
func (sqliteDialect) retryable(error) bool     { return false }

// beginWrite begins a transaction with db.BeginTx. Under OpenSQLite's
// _txlock=immediate that is BEGIN IMMEDIATE; under a DSN without it, it is
// a deferred BEGIN, which is as safe here: Acquire's first statement is
// its write, so SQLite takes the write lock (waiting under busy_timeout)
// before the transaction has read anything, and no upgrade can fail.
func (sqliteDialect) beginWrite(ctx context.Context, db *sql.DB) (*sql.Tx, error) {
	return db.BeginTx(ctx, nil)
}

// beginSchema runs BEGIN IMMEDIATE on a connection of its own, whatever
// _txlock the DSN set: Migrate reads before it writes, and the write lock
// held from BEGIN on is what serialises concurrent migrations.
func (sqliteDialect) beginSchema(ctx context.Context, db *sql.DB) (writeTx, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		discard(conn) // the BEGIN may or may not have taken effect
		return nil, err
	}
	return &immediateTx{Conn: conn, ctx: ctx}, nil
}

// immediateTx is a transaction begun with BEGIN IMMEDIATE on conn.
type immediateTx struct {
	*sql.Conn
	ctx  context.Context
	done bool
}

func (t *immediateTx) Commit() error {
	if t.done {
		return sql.ErrTxDone
	}
	t.done = true
	if _, err := t.ExecContext(t.ctx, "COMMIT"); err != nil {
		t.abort()
		return err
	}
	return t.Close()
}

func (t *immediateTx) Rollback() error {
	if t.done {
		return sql.ErrTxDone
	}
	t.done = true
	t.abort()
	return nil
}

// abort rolls back and returns the connection to the pool; a connection
// that cannot roll back may still be inside the transaction, so it is
// closed instead.
func (t *immediateTx) abort() {
	if _, err := t.ExecContext(context.WithoutCancel(t.ctx), "ROLLBACK"); err != nil {
		discard(t.Conn)
		return
	}
	_ = t.Close()
}

// discard closes conn's driver connection instead of returning it to the
// pool.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

// SQLite settings applied by OpenSQLite. See the package documentation for
// why these and the measurements behind them.
const (
	sqliteBusyTimeout = 10 * time.Second
	sqliteMaxConns    = 1
)

// sqliteDSN returns the modernc.org/sqlite DSN of OpenSQLite for path.
func sqliteDSN(path string) string {
	q := url.Values{}
	q.Set("_busy_timeout", fmt.Sprint(sqliteBusyTimeout.Milliseconds()))
	q.Set("_journal_mode", "WAL")
	q.Set("_synchronous", "FULL")
	q.Set("_txlock", "immediate")
	q.Add("_pragma", "foreign_keys(1)")
	return path + "?" + q.Encode()
}

// OpenSQLite opens the SQLite database file at path, creating it if need
// be, with the settings a Store relies on, and pings it:
//
//   - journal_mode=WAL: readers in other processes never block the
//     writer, nor it them, and a commit costs one fsync;
//   - busy_timeout=10000: a writer waits up to 10 s for another process
//     holding the write lock instead of failing with "database is locked";
//   - _txlock=immediate: every transaction begun with db.BeginTx takes the
//     write lock at BEGIN, so that none fails half way on a lock upgrade
//     (read-only transactions, sql.TxOptions{ReadOnly: true}, stay
//     deferred);
//   - synchronous=FULL: a committed transaction is on disk before COMMIT
//     returns, so a completed record survives a process, OS or power
//     crash;
//   - foreign_keys=ON, for the application's own tables;
//   - one connection (SetMaxOpenConns(1)), kept open: the process's
//     writers queue in the pool, in order, rather than in SQLite's
//     sleeping busy handler.
//
// The package documentation gives the measurements behind these choices.
// The application may use db for its own tables: a handler's transaction
// begun with db.BeginTx is IMMEDIATE, which is what [Store.CompleteTx]
// needs. While a transaction is open it holds the one connection: inside
// it, use the transaction only, never db or the Store's other methods.
// Path is a file path, not a URI; ":memory:" is refused. Close db when
// done.
func OpenSQLite(ctx context.Context, path string) (*sql.DB, error) {
	switch {
	case path == "":
		return nil, errors.New("sqlstore: OpenSQLite: empty path")
	case path == ":memory:" || strings.HasPrefix(path, "file:"):
		return nil, fmt.Errorf("sqlstore: OpenSQLite: %q is not a file path", path)
	case strings.ContainsAny(path, "?\x00"):
		return nil, fmt.Errorf("sqlstore: OpenSQLite: path %q holds '?' or NUL", path)
	}
	db, err := sql.Open("sqlite", sqliteDSN(path))
	if err != nil {
		return nil, fmt.Errorf("sqlstore: OpenSQLite: %w", err)
	}
	db.SetMaxOpenConns(sqliteMaxConns)
	db.SetMaxIdleConns(sqliteMaxConns)
	if err := pingSQLite(ctx, db); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("sqlstore: OpenSQLite %s: %w", path, err)
	}
	return db, nil
}

// pingSQLite opens the pool's first connection. Switching a new file to
// WAL needs an exclusive lock, and SQLite answers SQLITE_BUSY at once,
// without its busy handler, when another process opening the same new
// file holds it (several instances starting together on a fresh file):
// the connection is discarded and pingSQLite tries again, for up to the
// busy timeout.
func pingSQLite(ctx context.Context, db *sql.DB) error {
	deadline := time.Now().Add(sqliteBusyTimeout)
	for {
		err := db.PingContext(ctx)
		if err == nil || !strings.Contains(err.Error(), "SQLITE_BUSY") || time.Now().After(deadline) {
			return err
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
}
