package sqlstore_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

// setup opens a fresh, migrated SQLite database in t's temporary
// directory and returns it with its store.
func setup(t testing.TB) (*sql.DB, *sqlstore.Store) {
	t.Helper()
	db := openDB(t, filepath.Join(t.TempDir(), "idem.db"))
	s := newStore(t, db)
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return db, s
}

func openDB(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func newStore(t testing.TB, db *sql.DB) *sqlstore.Store {
	t.Helper()
	s, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}
