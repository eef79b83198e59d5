// Command shopd runs idem's reference shop service.
//
//	go run ./cmd/shopd [-addr 127.0.0.1:8080] [-data ./shopdata | -db DATABASE] [-redis redis://host:port/db] [-wait 0] [-log-level info]
//
// DATABASE is sqlite:PATH, postgres://user:pass@host:port/db (or
// postgresql://), mysql://user:pass@host:port/db (its query holds
// go-sql-driver parameters) or mysql:DSN (a raw go-sql-driver DSN). Bad
// flags exit with status 2 before anything starts. See internal/shop's Run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemkit/idem/internal/shop"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := shop.Run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, err)
		}
		stop()
		os.Exit(2)
	}
}
