// Package sqlitetest gives tests a fresh, migrated sqlstore on SQLite in
// their temporary directory.
package sqlitetest

import (
	"context"
	"database/sql"
	"github.com/idemkit/idem/sqlstore/sqlite"
	"path/filepath"
	"testing"

	"github.com/idemkit/idem/sqlstore"
)

// Open returns a new SQLite database in t's temporary directory, closed
// when t ends, with a migrated store over it. Each statement in ddl runs
// after the migration (business tables next to the records).
func Open(t testing.TB, ddl ...string) (*sql.DB, *sqlstore.Store) {
	t.Helper()
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	s, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
	if err != nil {
		t.Fatalf("sqlstore.New: %v", err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	for _, stmt := range ddl {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	return db, s
}
