package sqlstore_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/idemkit/idem/lock"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

// A lock in the database, on SQLite (PostgreSQL and MySQL alike): the
// fence comes from the lock's row and survives the release.
func ExampleNewLockBackend() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-lock-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	backend, err := sqlstore.NewLockBackend(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	if err := backend.Migrate(ctx); err != nil { // creates idem_locks
		log.Fatal(err)
	}
	locker, err := lock.New(backend, &lock.Config{TTL: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}

	for range 2 {
		lease, err := locker.Acquire(ctx, "nightly-report")
		if err != nil {
			log.Fatal(err)
		}
		// Present lease.Fence() to the resource:
		//   UPDATE reports SET …, last_fence = ? WHERE id = ? AND last_fence < ?
		fmt.Println("fence", lease.Fence())
		if err := lease.Release(ctx); err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// fence 1
	// fence 2
}
