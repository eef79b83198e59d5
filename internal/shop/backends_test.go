package shop_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/sqlstore"
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
	db, err := sqlstore.OpenSQLite(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, "sqlite:" + path
}

// freshPostgres creates a schema of the test's own and returns a pool
// whose search_path is that schema.
func freshPostgres(t *testing.T) (*sql.DB, string) {
	addr := testenv.Postgres.Need(t)
	admin := openServer(t, "pgx", addr, testenv.Postgres)
	schema := randomName("shop_test_")
	mustExec(t, admin, "CREATE SCHEMA "+schema)
	t.Cleanup(func() { mustExec(t, admin, "DROP SCHEMA "+schema+" CASCADE") })
	u, err := url.Parse(addr)
	if err != nil {
		t.Fatalf("%s: %v", testenv.Postgres.Var, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return openServer(t, "pgx", u.String(), testenv.Postgres), u.String()
}

// freshMySQL creates a database of the test's own.
func freshMySQL(t *testing.T) (*sql.DB, string) {
	addr := testenv.MySQL.Need(t)
	cfg, err := mysql.ParseDSN(addr)
	if err != nil {
		t.Fatalf("%s: %v", testenv.MySQL.Var, err)
	}
	admin := openServer(t, "mysql", addr, testenv.MySQL)
	name := randomName("shop_test_")
	mustExec(t, admin, "CREATE DATABASE "+name)
	t.Cleanup(func() { mustExec(t, admin, "DROP DATABASE "+name) })
	cfg.DBName = name
	dsn := cfg.FormatDSN()
	return openServer(t, "mysql", dsn, testenv.MySQL), "mysql:" + dsn
}

// openServer opens a pool on a database server, or skips t as unavailable.
func openServer(t *testing.T, driver, dsn string, svc testenv.Service) *sql.DB {
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

func mustExec(t *testing.T, db *sql.DB, stmt string) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), stmt); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}

// randomName returns prefix followed by 12 random hex digits.
func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
