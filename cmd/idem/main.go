// Command idem checks and adds idempotency for HTTP APIs, and operates
// idem's stores.
//
//	idem probe URL        check an API's Idempotency-Key semantics
//	idem proxy …          an idempotency gateway in front of any service
//	idem migrate …        create every idem table in a SQL database
//	idem sweep …          remove expired records
//	idem inspect …        show one record, or the in-flight and oldest ones
//	idem evict …          delete one record
//	idem help [COMMAND]   explain a command and its flags
//
// Exit status: 0 on success, 1 when a command ran and failed (a probe
// check failed, a store refused), 2 for bad flags or arguments. See
// cmd/internal/idemcli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemkit/idem/cmd/internal/idemcli"
)

func main() {
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := idemcli.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
