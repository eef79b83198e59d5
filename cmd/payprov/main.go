// Command payprov runs a simulated payment provider, idempotent by the
// Idempotency-Key header, with faults injected on command: the other side
// of the shop's refunds in tests. See cmd/internal/payprov.
//
//	go run ./cmd/payprov [-addr 127.0.0.1:0] [-refund-limit 0] [-state FILE]
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemkit/idem/cmd/internal/payprov"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	status := payprov.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(status)
}
