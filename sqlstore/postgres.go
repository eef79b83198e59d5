package sqlstore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/idemkit/idem/sqldialect"
)

// PostgreSQL is the dialect of PostgreSQL 12 or later, through any
// database/sql driver whose errors have a SQLState() string method (as
// github.com/jackc/pgx/v5/stdlib's do, and lib/pq's do not: use pgx). Open
// the database yourself:
//
//	import _ "github.com/jackc/pgx/v5/stdlib"
//
//	db, err := sql.Open("pgx", "postgres://user@host/db")
//
// The package documentation says what each statement costs and why.
var PostgreSQL Dialect = postgresDialect{}

type postgresDialect struct{}

var postgresStatements, postgresMigrations = mustLoad("postgres")

func (postgresDialect) Family() sqldialect.Family { return sqldialect.PostgreSQL }
func (postgresDialect) String() string            { return "postgres" }
func (postgresDialect) statements() *statements   { return postgresStatements }
func (postgresDialect) migrations() []migration   { return postgresMigrations }
func (postgresDialect) completeReturns() bool     { return true }
func (postgresDialect) deleteIfReads() bool       { return true }
func (postgresDialect) acquireMode() acquireMode  { return acquireOneStatement }
func (postgresDialect) sweepInTx()                {}

// missingTable: undefined_table, or undefined_function (idem_acquire_write
// comes with migration 2, idem_renewals, idem_records_renewed and
// idem_sweep with migration 3: a database migrated by an older build).
func (postgresDialect) missingTable(err error) bool {
	switch sqlState(err) {
	case "42P01", "42883":
		return true
	}
	return false
}

// retryable: serialization_failure (the session's default isolation is
// REPEATABLE READ or SERIALIZABLE and the upsert met a row its snapshot
// does not see; the next statement has a new snapshot) and
// deadlock_detected.
func (postgresDialect) retryable(err error) bool {
	switch sqlState(err) {
	case "40001", "40P01":
		return true
	}
	return false
}

// isolationQuery: the level a transaction begun without one runs at, as
// SET SESSION CHARACTERISTICS, ALTER DATABASE … SET, ALTER ROLE … SET or
// the connection string set it ("read committed", "repeatable read",
// "serializable", "read uncommitted", which PostgreSQL runs as READ
// COMMITTED). The Store's own statements run at READ COMMITTED whatever
// it is (see ownStatements).
func (postgresDialect) isolationQuery() string {
	return "SELECT current_setting('default_transaction_isolation')"
}

func (postgresDialect) readCommitted(level string) bool {
	return level == "read committed" || level == "read uncommitted"
}

// serializationFailure: serialization_failure (40001), which PostgreSQL
// raises only in a transaction at REPEATABLE READ or SERIALIZABLE.
func (postgresDialect) serializationFailure(err error) bool {
	return sqlState(err) == "40001"
}

// readCommitted are the options of every transaction the dialect begins:
// each statement sees what committed before it started, whatever the
// server's default_transaction_isolation.
var readCommitted = &sql.TxOptions{Isolation: sql.LevelReadCommitted}

func (postgresDialect) beginWrite(ctx context.Context, db *sql.DB) (*sql.Tx, error) {
	return db.BeginTx(ctx, readCommitted)
}

// beginSchema begins a READ COMMITTED transaction; lock_schema then takes
// a transaction-level advisory lock, so that each statement after it sees
// what the previous holder committed.
func (postgresDialect) beginSchema(ctx context.Context, db *sql.DB) (writeTx, error) {
	return db.BeginTx(ctx, readCommitted)
}

// sqlState returns the SQLSTATE of the first error in err's chain that has
// one (pgconn.PgError has), or "".
func sqlState(err error) string {
	var e interface{ SQLState() string }
	if errors.As(err, &e) {
		return e.SQLState()
	}
	return ""
}
