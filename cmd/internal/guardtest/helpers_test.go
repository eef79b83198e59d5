package guardtest_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	_ "github.com/go-sql-driver/mysql" // registers the "mysql" driver
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
	_ "github.com/lib/pq"              // registers the "postgres" driver

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/sqldialect"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

// A dialect is the SQL a server speaks; fsm takes it as it is.
type dialect = sqldialect.Family

const (
	postgres = sqldialect.PostgreSQL
	mysql    = sqldialect.MySQL
	sqlite3  = sqldialect.SQLite
)

// A server is one database the tests run on, through one driver.
type server struct {
	name    string
	dialect dialect
	// open returns a pool on a fresh database (schema) of the test's own.
	open func(t testing.TB) *sql.DB
}

// servers are the databases and drivers every test runs on.
var servers = []server{
	{"PostgreSQL-pgx", postgres, func(t testing.TB) *sql.DB { db, _ := testdb.Postgres(t); return db }},
	{"PostgreSQL-libpq", postgres, func(t testing.TB) *sql.DB {
		_, url := testdb.Postgres(t)
		return testdb.Open(t, "postgres", url, testenv.Postgres)
	}},
	{"MariaDB", mysql, func(t testing.TB) *sql.DB { db, _ := testdb.MySQL(t); return db }},
	{"SQLite", sqlite3, openSQLite},
}

// openSQLite opens a fresh SQLite database in t's temporary directory.
func openSQLite(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "guard.db"))
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// rebind turns the ? placeholders of query into $1, $2 … for PostgreSQL.
func rebind(d dialect, query string) string {
	if d != postgres {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// execAll runs each statement on db, failing t on an error.
func execAll(t testing.TB, db *sql.DB, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		if _, err := db.ExecContext(context.Background(), s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// count returns the result of a SELECT COUNT(*) … query.
func count(t testing.TB, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, d dialect, query string, args ...any) int {
	t.Helper()
	var n int
	if err := q.QueryRowContext(context.Background(), rebind(d, query), args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}
