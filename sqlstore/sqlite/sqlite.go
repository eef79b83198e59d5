// Package sqlite opens SQLite database files for sqlstore with the
// settings its Store relies on, through modernc.org/sqlite (pure Go, no
// cgo). It is a package of its own so that a program that stores its
// records in PostgreSQL or MySQL never compiles the SQLite driver: import
// it only where SQLite is used.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Settings applied by Open. The sqlstore package documentation gives the
// measurements behind them.
const (
	busyTimeout = 10 * time.Second
	maxConns    = 1
)

// DSN returns the modernc.org/sqlite data source name Open uses for path:
// the settings below, without the pool's (one connection). A program that
// opens the database itself with sql.Open("sqlite", DSN(path)) gets them.
func DSN(path string) string {
	q := url.Values{}
	q.Set("_busy_timeout", fmt.Sprint(busyTimeout.Milliseconds()))
	q.Set("_journal_mode", "WAL")
	q.Set("_synchronous", "FULL")
	q.Set("_txlock", "immediate")
	q.Add("_pragma", "foreign_keys(1)")
	return path + "?" + q.Encode()
}

// Open opens the SQLite database file at path, creating it if need
// be, with the settings a Store relies on, and pings it:
//
//   - journal_mode=WAL: readers in other processes never block the
//     writer, nor it them, and a commit costs one fsync;
//   - busy_timeout=10000: a writer waits up to 10 s for another process
//     holding the write lock instead of failing with "database is locked";
//   - _txlock=immediate: every transaction begun with db.BeginTx takes the
//     write lock at BEGIN, so that none fails half way on a lock upgrade
//     (read-only transactions, sql.TxOptions{ReadOnly: true}, stay
//     deferred);
//   - synchronous=FULL: a committed transaction is on disk before COMMIT
//     returns, so a completed record survives a process, OS or power
//     crash;
//   - foreign_keys=ON, for the application's own tables;
//   - one connection (SetMaxOpenConns(1)), kept open: the process's
//     writers queue in the pool, in order, rather than in SQLite's
//     sleeping busy handler.
//
// The sqlstore package documentation gives the measurements behind these
// choices.
// The application may use db for its own tables: a handler's transaction
// begun with db.BeginTx is IMMEDIATE, which is what sqlstore's Store.CompleteTx
// needs. While a transaction is open it holds the one connection: inside
// it, use the transaction only, never db or the store's other methods.
// Path is a file path, not a URI; ":memory:" is refused. Close db when
// done.
func Open(ctx context.Context, path string) (*sql.DB, error) {
	switch {
	case path == "":
		return nil, errors.New("sqlite: Open: empty path")
	case path == ":memory:" || strings.HasPrefix(path, "file:"):
		return nil, fmt.Errorf("sqlite: Open: %q is not a file path", path)
	case strings.ContainsAny(path, "?\x00"):
		return nil, fmt.Errorf("sqlite: Open: path %q holds '?' or NUL", path)
	}
	db, err := sql.Open("sqlite", DSN(path))
	if err != nil {
		return nil, fmt.Errorf("sqlite: Open: %w", err)
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	if err := ping(ctx, db); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("sqlite: Open %s: %w", path, err)
	}
	return db, nil
}

// ping opens the pool's first connection. Switching a new file to
// WAL needs an exclusive lock, and SQLite answers SQLITE_BUSY at once,
// without its busy handler, when another process opening the same new
// file holds it (several instances starting together on a fresh file):
// the connection is discarded and ping tries again, for up to the
// busy timeout.
func ping(ctx context.Context, db *sql.DB) error {
	deadline := time.Now().Add(busyTimeout)
	for {
		err := db.PingContext(ctx)
		if err == nil || !strings.Contains(err.Error(), "SQLITE_BUSY") || time.Now().After(deadline) {
			return err
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
}

// sleep sleeps for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
