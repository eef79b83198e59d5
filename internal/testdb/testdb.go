// Package testdb gives a test a database of its own on the PostgreSQL and
// MySQL/MariaDB servers that internal/testenv finds: a schema or a
// database with a random name, dropped when the test ends. Tests that
// share idem's tables with other test processes (which sweep them) use it
// when they need expired records to stay until they read them.
//
// It imports the standard library only: the test registers the drivers it
// names ("pgx" from github.com/jackc/pgx/v5/stdlib, "mysql" from
// github.com/go-sql-driver/mysql).
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testenv"
)

// Postgres creates a schema of the test's own and returns a pool whose
// search_path is that schema, and its URL. It skips t (or fails it, under
// IDEM_REQUIRE_SERVICES=1) when the server is unreachable.
func Postgres(t testing.TB) (*sql.DB, string) {
	t.Helper()
	addr := testenv.Postgres.Need(t)
	admin := Open(t, "pgx", addr, testenv.Postgres)
	schema := RandomName("idem_test_")
	exec(t, admin, "CREATE SCHEMA "+schema)
	t.Cleanup(func() { exec(t, admin, "DROP SCHEMA "+schema+" CASCADE") })
	u, err := url.Parse(addr)
	if err != nil {
		t.Fatalf("%s: %v", testenv.Postgres.Var, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return Open(t, "pgx", u.String(), testenv.Postgres), u.String()
}

// MySQL creates a database of the test's own and returns a pool on it,
// and its go-sql-driver DSN. It skips t (or fails it, under
// IDEM_REQUIRE_SERVICES=1) when the server is unreachable.
func MySQL(t testing.TB) (*sql.DB, string) {
	t.Helper()
	addr := testenv.MySQL.Need(t)
	admin := Open(t, "mysql", addr, testenv.MySQL)
	name := RandomName("idem_test_")
	exec(t, admin, "CREATE DATABASE "+name)
	t.Cleanup(func() { exec(t, admin, "DROP DATABASE "+name) })
	dsn := WithDatabase(addr, name)
	return Open(t, "mysql", dsn, testenv.MySQL), dsn
}

// WithDatabase returns the go-sql-driver DSN dsn with its database
// replaced by name: the database follows the last '/' before the DSN's
// parameters ('?' after the address).
func WithDatabase(dsn, name string) string {
	base, params := dsn, ""
	if j := strings.IndexByte(dsn[strings.LastIndexByte(dsn, ')')+1:], '?'); j >= 0 {
		j += strings.LastIndexByte(dsn, ')') + 1
		base, params = dsn[:j], dsn[j:]
	}
	if i := strings.LastIndexByte(base, '/'); i >= 0 {
		base = base[:i]
	}
	return base + "/" + name + params
}

// Open opens a pool of at most 8 connections on a database server, closed
// when the test ends, or skips t as the service being unavailable.
func Open(t testing.TB, driver, dsn string, svc testenv.Service) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatalf("sql.Open(%s): %v", driver, err)
	}
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(8)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		testenv.Unavailable(t, svc.Name, svc.Var, err)
	}
	return db
}

// RandomName returns prefix followed by 12 random hex digits.
func RandomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func exec(t testing.TB, db *sql.DB, stmt string) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), stmt); err != nil {
		t.Errorf("%s: %v", stmt, err)
	}
}

// PostgresAt is Postgres with sessions whose default_transaction_isolation
// is level ("repeatable read", "serializable"; a runtime parameter of the
// URL): a pool on a schema of the test's own, and its URL. It fails t when
// the session does not run at level.
func PostgresAt(t testing.TB, level string) (*sql.DB, string) {
	t.Helper()
	_, addr := Postgres(t)
	return AtIsolation(t, addr, level)
}

// AtIsolation opens a pool on the PostgreSQL URL dsn whose sessions'
// default_transaction_isolation is level, and returns it with its URL;
// it fails t when the server does not report that level.
func AtIsolation(t testing.TB, dsn, level string) (*sql.DB, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("%s: %v", testenv.Postgres.Var, err)
	}
	q := u.Query()
	q.Set("default_transaction_isolation", level)
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20") // libpq reads no +
	db := Open(t, "pgx", u.String(), testenv.Postgres)
	var got string
	if err := db.QueryRowContext(context.Background(), "SHOW transaction_isolation").Scan(&got); err != nil || got != level {
		t.Fatalf("transaction_isolation = %q, %v; want %q", got, err, level)
	}
	return db, u.String()
}

// MySQLAt is MySQL with sessions whose transaction isolation is level
// ("REPEATABLE READ", "READ COMMITTED", "SERIALIZABLE"; a hyphen may
// stand for the space): MariaDB and MySQL have no per-database default,
// so the DSN sets the session variable on each connection
// (transaction_isolation, or tx_isolation on servers that lack it, as
// MariaDB before 11.1 does). It returns a pool on a database of the
// test's own and its DSN, and fails t when the session does not run at
// level, so that a test never trusts the server's default.
func MySQLAt(t testing.TB, level string) (*sql.DB, string) {
	t.Helper()
	admin, dsn := MySQL(t)
	variable := "transaction_isolation"
	var got string
	if admin.QueryRowContext(context.Background(), "SELECT @@SESSION.transaction_isolation").Scan(&got) != nil {
		variable = "tx_isolation"
	}
	want := strings.ToUpper(strings.ReplaceAll(level, " ", "-"))
	sep := "?"
	if strings.Contains(dsn[strings.LastIndexByte(dsn, ')')+1:], "?") {
		sep = "&"
	}
	dsn += sep + variable + "=" + url.QueryEscape("'"+want+"'")
	db := Open(t, "mysql", dsn, testenv.MySQL)
	if err := db.QueryRowContext(context.Background(), "SELECT @@SESSION."+variable).Scan(&got); err != nil || got != want {
		t.Fatalf("%s = %q, %v; want %q", variable, got, err, want)
	}
	return db, dsn
}
