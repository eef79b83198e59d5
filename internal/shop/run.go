package shop

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/idemkit/idem/sqlstore"
)

// shutdownTimeout bounds how long in-flight requests may run after a stop
// signal.
const shutdownTimeout = 30 * time.Second

// Run is shopd's main: it parses args, opens the data directory, serves
// until ctx is cancelled (SIGINT/SIGTERM in shopd), then lets in-flight
// requests finish and closes the database.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("shopd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8080", "address to listen on")
	dataDir := fs.String("data", "./shopdata", "directory of the embedded SQLite database")
	wait := fs.Duration("wait", 0, "how long a retry waits for an in-flight first request before 409 (0: answer 409 at once)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("shopd: unexpected arguments %q", fs.Args())
	}
	if *wait < 0 {
		return fmt.Errorf("shopd: -wait must not be negative")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("shopd: -log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	if err := os.MkdirAll(*dataDir, 0o755); err != nil {
		return fmt.Errorf("shopd: data directory: %w", err)
	}
	db, err := sqlstore.OpenSQLite(ctx, filepath.Join(*dataDir, "shop.db"))
	if err != nil {
		return fmt.Errorf("shopd: open database: %w", err)
	}
	defer db.Close()
	store, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.SQLite, Logger: log})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return fmt.Errorf("shopd: migrate idempotency store: %w", err)
	}
	if err := Migrate(ctx, db); err != nil {
		return fmt.Errorf("shopd: %w", err)
	}
	shop, err := New(Config{DB: db, Store: store, Wait: *wait, Logger: log})
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("shopd: listen: %w", err)
	}
	srv := &http.Server{
		Handler:           shop,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	base := "http://" + ln.Addr().String()
	fmt.Fprintf(stdout, "shopd listening on %s (data in %s)\n\nTry it:\n"+
		"  curl -i -X POST %s/orders -H 'X-User-ID: 1' -H 'Idempotency-Key: order-1' \\\n"+
		"       -H 'Content-Type: application/json' -d '{\"sku\":\"BOOK-1\",\"quantity\":2}'\n"+
		"  (run it again: the same order comes back with Idempotent-Replayed: true)\n"+
		"  curl -s %s/orders -H 'X-User-ID: 1'\n", base, *dataDir, base, base)

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	select {
	case err := <-serveErr:
		return fmt.Errorf("shopd: serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shopd: shutting down; waiting for in-flight requests")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shopd: shutdown: %w", err)
	}
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shopd: serve: %w", err)
	}
	log.Info("shopd: stopped")
	return nil
}
