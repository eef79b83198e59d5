package sqlstore_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlstore"
)

// A Store on PostgreSQL. The application opens the pool with pgx's
// database/sql driver (import _ "github.com/jackc/pgx/v5/stdlib") and
// keeps it; the store only runs statements on it. (Not run: it needs a
// server.)
func ExamplePostgreSQL() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://app@db.internal:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.PostgreSQL})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil { // at start-up, from any number of instances
		log.Fatal(err)
	}
	if _, err := idem.NewGuard(store, nil); err != nil {
		log.Fatal(err)
	}
}

// A Store on MySQL or MariaDB, through go-sql-driver/mysql (import _
// "github.com/go-sql-driver/mysql"). The DSN needs no particular setting.
// (Not run: it needs a server.)
func ExampleMySQL() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "app:secret@tcp(db.internal:3306)/app")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.MySQL})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil { // at start-up, from any number of instances
		log.Fatal(err)
	}
	if _, err := idem.NewGuard(store, nil); err != nil {
		log.Fatal(err)
	}
}
