package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/sqldialect"
)

// MySQL is the dialect of MySQL 8.0 and 8.4 and MariaDB 10.6 or later
// (InnoDB), through github.com/go-sql-driver/mysql. Open the database
// yourself:
//
//	import _ "github.com/go-sql-driver/mysql"
//
//	db, err := sql.Open("mysql", "user:password@tcp(host:3306)/db")
//
// No DSN setting is required: times are BIGINT milliseconds (parseTime is
// irrelevant), statements run one at a time (multiStatements is not
// needed), and neither the session's time zone nor its sql_mode matters
// (MariaDB's EMPTY_STRING_IS_NULL and ORACLE included). The package documentation says
// what each statement costs and why, and which versions are tested.
var MySQL Dialect = mysqlDialect{}

type mysqlDialect struct{}

var mysqlStatements, mysqlMigrations = mustLoad("mysql")

func (mysqlDialect) Family() sqldialect.Family { return sqldialect.MySQL }
func (mysqlDialect) String() string            { return "mysql" }
func (mysqlDialect) statements() *statements   { return mysqlStatements }
func (mysqlDialect) migrations() []migration   { return mysqlMigrations }
func (mysqlDialect) completeReturns() bool     { return false }
func (mysqlDialect) deleteIfReads() bool       { return false }
func (mysqlDialect) acquireMode() acquireMode  { return acquireUpsertRead }

// The insert id of the acquire upsert's update branch (its
// LAST_INSERT_ID(took)): it took a processing record (a takeover, or the
// replacement of an abandoned record: TookOver), or replaced an expired
// completed one. 0 means it took nothing; an insert reports the
// database's now, far above both.
const (
	mysqlTookProcessing = 1
	mysqlReplaced       = 2
)

// missingTable: ER_NO_SUCH_TABLE.
func (mysqlDialect) missingTable(err error) bool { return mysqlErrNumber(err) == 1146 }

// retryable: ER_LOCK_DEADLOCK. InnoDB rolled back the statement (the
// upsert, run on its own) and it may run again. A lock wait timeout
// (1205) is not retried: it already waited innodb_lock_wait_timeout.
func (mysqlDialect) retryable(err error) bool { return mysqlErrNumber(err) == 1213 }

// mysqlErrNumber returns the server error number of the first
// *mysql.MySQLError in err's tree (errors.As), or 0. An error that only
// reads like one is not one.
func mysqlErrNumber(err error) uint16 {
	var e *mysql.MySQLError
	if errors.As(err, &e) {
		return e.Number
	}
	return 0
}

func (mysqlDialect) beginWrite(ctx context.Context, db *sql.DB) (*sql.Tx, error) {
	return db.BeginTx(ctx, readCommitted)
}

// mysqlSchemaLock is the name of the GET_LOCK lock that serialises
// migrations, and mysqlSchemaLockWait how long Migrate waits for it.
const (
	mysqlSchemaLock     = "idem_migrate"
	mysqlSchemaLockWait = 30 * time.Second
)

// beginSchema takes GET_LOCK('idem_migrate') on a connection of its own.
// MySQL commits every DDL statement by itself, so the migration is no
// transaction: the named lock, held by the connection until Commit or
// Rollback releases it (or the connection ends), is what makes one
// caller migrate while the others wait and then find nothing to do.
func (mysqlDialect) beginSchema(ctx context.Context, db *sql.DB) (writeTx, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	var got sql.NullInt64
	err = conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", mysqlSchemaLock, int(mysqlSchemaLockWait/time.Second)).Scan(&got)
	switch {
	case err != nil:
		discard(conn) // the lock may or may not be held
		return nil, err
	case !got.Valid || got.Int64 != 1:
		_ = conn.Close()
		return nil, fmt.Errorf("GET_LOCK(%q) not granted within %v", mysqlSchemaLock, mysqlSchemaLockWait)
	}
	return &namedLockTx{Conn: conn, ctx: ctx}, nil
}

// namedLockTx runs Migrate's statements on conn while it holds the named
// lock; each statement commits on its own.
type namedLockTx struct {
	*sql.Conn
	ctx  context.Context
	done bool
}

func (t *namedLockTx) Commit() error {
	if t.done {
		return sql.ErrTxDone
	}
	t.done = true
	return t.release()
}

func (t *namedLockTx) Rollback() error {
	if t.done {
		return sql.ErrTxDone
	}
	t.done = true
	_ = t.release()
	return nil
}

// release releases the lock and returns the connection to the pool; a
// connection that cannot release it is closed instead, which releases it.
func (t *namedLockTx) release() error {
	if _, err := t.ExecContext(context.WithoutCancel(t.ctx), "DO RELEASE_LOCK(?)", mysqlSchemaLock); err != nil {
		discard(t.Conn)
		return err
	}
	return t.Close()
}
