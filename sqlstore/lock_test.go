package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/lock"
	"github.com/idemkit/idem/lock/locktest"
	"github.com/idemkit/idem/sqlstore"
)

// lockDB returns a database of the test's own for srv (a schema on
// PostgreSQL, a database on MySQL, a file on SQLite), migrated, and its
// DSN (the file's path on SQLite). Other test processes, which migrate
// and sweep the shared test database, never meet its tables.
func lockDB(t testing.TB, srv server) (*sql.DB, string) {
	t.Helper()
	var db *sql.DB
	var dsn string
	switch srv.dialect {
	case sqlstore.SQLite:
		dsn = filepath.Join(t.TempDir(), "locks.db")
		db = openDB(t, dsn)
	case sqlstore.PostgreSQL:
		db, dsn = testdb.Postgres(t)
	case sqlstore.MySQL:
		db, dsn = testdb.MySQL(t)
	}
	db.SetMaxIdleConns(2)
	s, err := sqlstore.New(db, &sqlstore.Config{Dialect: srv.dialect})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return db, dsn
}

func newLockBackend(t testing.TB, db *sql.DB, d sqlstore.Dialect) *sqlstore.LockBackend {
	t.Helper()
	b, err := sqlstore.NewLockBackend(db, &sqlstore.Config{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func TestLockConformance(t *testing.T) {
	t.Parallel()
	forDialects(t, func(t *testing.T, srv server) {
		db, _ := lockDB(t, srv)
		b := newLockBackend(t, db, srv.dialect)
		locktest.Run(t, func(*testing.T) lock.Backend { return b })
	})
}

// The MySQL dialect's acquire statement holds under MariaDB's
// SIMULTANEOUS_ASSIGNMENT, where every assignment of ON DUPLICATE KEY
// UPDATE reads the row as it was.
func TestLockConformanceSimultaneousAssignment(t *testing.T) {
	t.Parallel()
	_, dsn := lockDB(t, servers[1])
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["sql_mode"] = "'STRICT_TRANS_TABLES,SIMULTANEOUS_ASSIGNMENT'"
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(8)
	var mode string
	if err := db.QueryRowContext(t.Context(), "SELECT @@SESSION.sql_mode").Scan(&mode); err != nil {
		t.Skipf("the server refuses SIMULTANEOUS_ASSIGNMENT (MySQL, not MariaDB): %v", err)
	}
	if !strings.Contains(mode, "SIMULTANEOUS_ASSIGNMENT") {
		t.Fatalf("sql_mode %q", mode)
	}
	b := newLockBackend(t, db, sqlstore.MySQL)
	locktest.Run(t, func(*testing.T) lock.Backend { return b })
}

func TestNewLockBackendRejects(t *testing.T) {
	t.Parallel()
	if _, err := sqlstore.NewLockBackend(nil, &sqlstore.Config{Dialect: sqlstore.SQLite}); err == nil {
		t.Error("nil db accepted")
	}
	for _, cfg := range []*sqlstore.Config{nil, {}} {
		if _, err := sqlstore.NewLockBackend(&sql.DB{}, cfg); err == nil || !strings.Contains(err.Error(), "Config.Dialect is required") {
			t.Errorf("NewLockBackend(db, %v) = %v, want Config.Dialect is required", cfg, err)
		}
		if _, err := sqlstore.NewInboxStore(&sql.DB{}, cfg); err == nil || !strings.Contains(err.Error(), "Config.Dialect is required") {
			t.Errorf("NewInboxStore(db, %v) = %v, want Config.Dialect is required", cfg, err)
		}
	}
}

// Without Migrate, the error says so; after Close, ErrClosed.
func TestLockBackendUnmigratedAndClosed(t *testing.T) {
	t.Parallel()
	db := openDB(t, filepath.Join(t.TempDir(), "bare.db"))
	b := newLockBackend(t, db, sqlstore.SQLite)
	if _, err := b.Acquire(t.Context(), "job", lock.NewOwner(), time.Minute); err == nil || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("Acquire before Migrate = %v, want an error that names Migrate", err)
	}
	if err := b.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	f, err := b.Acquire(t.Context(), "job", lock.NewOwner(), time.Minute)
	if err != nil || f != 1 {
		t.Fatalf("Acquire after Migrate = %d, %v", f, err)
	}
	var rows int
	if err := db.QueryRow("SELECT count(*) FROM idem_locks WHERE name = 'job' AND fence = 1").Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("idem_locks: %d rows, %v", rows, err)
	}
	_ = b.Close()
	if _, err := b.Acquire(t.Context(), "job2", lock.NewOwner(), time.Minute); !errors.Is(err, sqlstore.ErrClosed) {
		t.Fatalf("Acquire after Close = %v, want ErrClosed", err)
	}
}

// The row stays after release and expiry, with the fence the next
// acquisition continues, and a released row has no owner.
func TestLockRowKeepsFence(t *testing.T) {
	t.Parallel()
	forDialects(t, func(t *testing.T, srv server) {
		db, _ := lockDB(t, srv)
		b := newLockBackend(t, db, srv.dialect)
		ctx := t.Context()
		o := lock.NewOwner()
		f, err := b.Acquire(ctx, "job", o, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Release(ctx, "job", o, f); err != nil {
			t.Fatal(err)
		}
		var owner string
		var fence int64
		if err := db.QueryRowContext(ctx, srv.rebind("SELECT owner, fence FROM idem_locks WHERE name = ?"), "job").Scan(&owner, &fence); err != nil {
			t.Fatal(err)
		}
		if owner != "" || fence != f {
			t.Fatalf("row after release: owner %q fence %d, want '' and %d", owner, fence, f)
		}
	})
}
