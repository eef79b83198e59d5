package payprov

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// shutdownTimeout bounds how long Main waits for requests in flight when
// its context ends.
const shutdownTimeout = 10 * time.Second

// Main runs the provider as a process, with the flags in args:
//
//	-addr 127.0.0.1:0    the address to listen on
//	-refund-limit 0      Config.RefundLimitCents
//	-state FILE          Config.StatePath
//
// Its first line on stdout is "payprov listening on http://HOST:PORT"; the
// log goes to stderr. It serves until ctx ends, then ends the requests
// that faults hold, lets the others finish (up to 10 s) and returns 0; it
// returns 2 for bad flags or an address it cannot listen on, 1 for other
// failures.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("payprov", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:0", "the address to listen on")
	limit := fs.Int64("refund-limit", 0, "the most refunded per unregistered payment, in cents (0: no limit)")
	statePath := fs.String("state", "", "a JSON file that keeps the state across restarts (default: memory only)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "payprov: unexpected arguments %q\n", fs.Args())
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	srv, err := New(&Config{RefundLimitCents: *limit, StatePath: *statePath, Logger: log})
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintf(stderr, "payprov: %v\n", err)
		return 2
	}
	fmt.Fprintf(stdout, "payprov listening on http://%s\n", ln.Addr())
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	select {
	case err := <-served:
		srv.Close()
		fmt.Fprintf(stderr, "payprov: %v\n", err)
		return 1
	case <-ctx.Done():
	}
	srv.Close()
	stop, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(stop); err != nil {
		fmt.Fprintf(stderr, "payprov: shutting down: %v\n", err)
		return 1
	}
	<-served
	return 0
}
