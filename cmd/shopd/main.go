// Command shopd runs idem's reference shop service.
//
//	go run ./cmd/shopd [-addr 127.0.0.1:8080] [-data ./shopdata | -db DATABASE] [-redis redis://host:port/db] [-wait 0]
//	                   [-read-timeout 30s] [-write-timeout 1m] [-idle-timeout 1m] [-log-level info]
//	                   [-pay-secret SECRET] [-pay-timeout 30m]
//	                   [-broker nats://host:port | -broker amqp://user:pass@host:port/vhost] [-nats-store DIR]
//	                   [-events shop] [-event-prefix shop-] [-event-retention 168h]
//
// DATABASE is sqlite:PATH, postgres://user:pass@host:port/db (or
// postgresql://), mysql://user:pass@host:port/db (its query holds
// go-sql-driver parameters) or mysql:DSN (a raw go-sql-driver DSN).
// SECRET signs payment callbacks; without it shopd reads SHOPD_PAY_SECRET,
// else uses dev-pay-secret and warns. Without -broker the order events go
// through a NATS server embedded in shopd. -events NAME names everything
// shopd declares on the broker (stream NAME_ORDERS, subjects
// NAME.order.>, exchange NAME.events, queue NAME-loyalty, …): two shops
// on one broker need different ones. Sent events and the loyalty
// consumer's finished records are deleted after -event-retention.
//
// Bad flags, a malformed OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), or an address shopd cannot listen
// on, exit with status 2 before any data is touched. The first SIGINT or
// SIGTERM lets in-flight requests finish (exit status 0; 1 if some still
// run after 30 s); a second one exits at once with status 1, unless it
// comes within 250 ms of the first (one stop delivered twice, as
// timeout(1) does). A signal during startup stops shopd with status 0.
// SIGPIPE is ignored: a log reader that went away does not end shopd. See
// cmd/internal/shop's Main and Run.
package main

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/idemkit/idem/cmd/internal/shop"
)

func main() {
	// A log reader that went away (shopd 2>&1 | tee log, Ctrl-C reaching
	// tee too) must not kill shopd at its next log line, in the middle of
	// the drain: its writes fail with EPIPE instead.
	signal.Ignore(syscall.SIGPIPE)
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	os.Exit(shop.Main(os.Args[1:], os.Stdout, os.Stderr, signals))
}
