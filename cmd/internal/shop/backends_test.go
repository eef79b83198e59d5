package shop_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

// A backend is a database the shop runs on in tests. fresh returns an
// empty database of its own (a SQLite file, a PostgreSQL schema, a MySQL
// database), dropped when the test ends, and the -db value that reaches it;
// it skips t when the server is unreachable.
type backend struct {
	name    string
	dialect sqlstore.Dialect
	fresh   func(t *testing.T) (*sql.DB, string)
}

var (
	sqliteBackend   = backend{"sqlite", sqlstore.SQLite, freshSQLite}
	postgresBackend = backend{"postgres", sqlstore.PostgreSQL, freshPostgres}
	mysqlBackend    = backend{"mysql", sqlstore.MySQL, freshMySQL}
	backends        = []backend{sqliteBackend, postgresBackend, mysqlBackend}
)

// forBackends runs f as a parallel subtest on each backend.
func forBackends(t *testing.T, f func(t *testing.T, b backend)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			f(t, b)
		})
	}
}

func freshSQLite(t *testing.T) (*sql.DB, string) {
	path := filepath.Join(t.TempDir(), "shop.db")
	db, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, "sqlite:" + path
}

// freshPostgres: a schema of the test's own (internal/testdb), reached by
// sessions whose default isolation is READ COMMITTED, PostgreSQL's
// default, set rather than trusted.
func freshPostgres(t *testing.T) (*sql.DB, string) { return testdb.PostgresAt(t, "read committed") }

// freshMySQL: a database of the test's own (internal/testdb), reached by
// sessions at REPEATABLE READ, MariaDB's and MySQL's default, set rather
// than trusted; and the -db value that reaches it.
func freshMySQL(t *testing.T) (*sql.DB, string) { return freshMySQLAt("REPEATABLE READ")(t) }

func mustExec(t *testing.T, db *sql.DB, stmt string) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), stmt); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}
