package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"strings"

	"github.com/idemkit/idem/sqldialect"
)

// SQLite is the dialect of SQLite 3.42 or later (modernc.org/sqlite or any
// other driver). Open the database with the sqlite subpackage's Open
// (github.com/idemkit/idem/sqlstore/sqlite), or with the settings it
// documents: WAL, a busy timeout of seconds, and IMMEDIATE transactions.
var SQLite Dialect = sqliteDialect{}

type sqliteDialect struct{}

var sqliteStatements, sqliteMigrations = mustLoad("sqlite")

func (sqliteDialect) Family() sqldialect.Family { return sqldialect.SQLite }
func (sqliteDialect) String() string            { return "sqlite" }
func (sqliteDialect) statements() *statements   { return sqliteStatements }
func (sqliteDialect) migrations() []migration   { return sqliteMigrations }

// missingTable: a missing table, or a missing column (took_over comes
// with migration 2: a database migrated by an older build).
func (sqliteDialect) missingTable(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "no such table") || strings.Contains(msg, "no such column") || strings.Contains(msg, "has no column named")
}
func (sqliteDialect) completeReturns() bool    { return true }
func (sqliteDialect) deleteIfReads() bool      { return false }
func (sqliteDialect) acquireMode() acquireMode { return acquireInTx }
func (sqliteDialect) retryable(error) bool     { return false }

// beginWrite begins a transaction with db.BeginTx. Under sqlite.Open's
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
