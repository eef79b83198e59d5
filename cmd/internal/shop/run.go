package shop

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/idemkit/idem/idemprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/admin"
	"github.com/idemkit/idem/cmd/internal/dsn"
	"github.com/idemkit/idem/cmd/internal/payprov"
	"github.com/idemkit/idem/cmd/internal/tracing"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/tieredstore"
)

// shutdownTimeout bounds how long in-flight requests may run after a stop
// signal. A variable for the tests.
var shutdownTimeout = 30 * time.Second

// errDrainIncomplete: requests were still in flight when shutdownTimeout
// ended the drain.
var errDrainIncomplete = fmt.Errorf("shopd: requests still in flight after %v; stopping without them", shutdownTimeout)

// maxReadHeaderTimeout bounds the time to read a request's headers (less
// when -read-timeout is shorter).
const maxReadHeaderTimeout = 10 * time.Second

// Defaults of the connection timeouts (the flags -read-timeout,
// -write-timeout and -idle-timeout).
const (
	defaultReadTimeout  = 30 * time.Second
	defaultWriteTimeout = 60 * time.Second
	defaultIdleTimeout  = 60 * time.Second
	// writeMargin: the default -write-timeout leaves at least this long
	// for the handler and the answer after -read-timeout and -wait.
	writeMargin = 30 * time.Second
)

// duplicateSignalWindow: a signal that comes this soon after the first is
// the first stop delivered twice, not a second one. timeout(1) and other
// supervisors signal a process and then its whole process group, and a
// terminal's Ctrl-C reaches every process of the foreground group, so one
// stop can arrive twice within microseconds; a person who presses Ctrl-C
// again because the drain takes too long does so later.
const duplicateSignalWindow = 250 * time.Millisecond

// Exit statuses of Main.
const (
	// ExitOK: shopd stopped cleanly (also when stopped while starting).
	ExitOK = 0
	// ExitInterrupted: shopd stopped before in-flight requests had
	// finished: a second signal, or the 30 s bound of the drain.
	ExitInterrupted = 1
	// ExitError: shopd could not start (bad flags, an address it cannot
	// listen on, a database it cannot open) or failed while serving.
	ExitError = 2
)

// Main is shopd's main. It runs Run with args until the first signal
// arrives on signals, then lets in-flight requests finish for up to 30 s
// (and returns ExitInterrupted if some still run then); a second signal
// during that drain ends Main at once, without waiting for them. A signal
// within 250 ms of the first is that stop delivered twice (as timeout(1)
// does, signalling the process and its group) and is ignored. A signal
// while shopd is still starting stops it cleanly (ExitOK). Main returns
// the process's exit status (ExitOK, ExitInterrupted or ExitError) after
// writing any error to stderr. The caller, shopd's main, delivers SIGINT
// and SIGTERM on signals (with room for two) and exits with the status,
// which also ends requests still running.
func Main(args []string, stdout, stderr io.Writer, signals <-chan os.Signal) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, args, stdout, stderr) }()
	var err error
	select {
	case err = <-done:
	case <-signals:
		cancel()
		first := time.Now()
	drain:
		for {
			select {
			case err = <-done:
				break drain
			case sig := <-signals:
				if time.Since(first) < duplicateSignalWindow {
					// The first stop, delivered twice.
					continue
				}
				fmt.Fprintf(stderr, "shopd: second %v: stopping without waiting for in-flight requests\n", sig)
				return ExitInterrupted
			}
		}
	}
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, errDrainIncomplete):
		fmt.Fprintln(stderr, err)
		return ExitInterrupted
	case !errors.Is(err, flag.ErrHelp):
		fmt.Fprintln(stderr, err)
	}
	return ExitError
}

// Run parses shopd's args, listens on -addr, opens the database (and
// Redis, with -redis), serves until ctx is cancelled (the first SIGINT or
// SIGTERM in shopd), then lets in-flight requests finish for up to 30 s and
// closes the database. Bad flags and an address it cannot listen on return
// an error before any data is touched: no data directory, no database
// file, no migration.
//
// Connections are bounded in time: a request's headers and body must
// arrive within -read-timeout (its headers within 10 s at most), its answer
// must be written within -write-timeout of its headers (which must exceed
// -read-timeout plus -wait, so that a body that arrives in time, or a
// retry that waits, still has its answer written), and a keep-alive
// connection with no request is closed after -idle-timeout. A client that
// stalls or trickles its body is cut off instead of holding a connection
// and its buffer indefinitely. An answer not written in time is lost to the
// client, not to the shop: an order it created is stored with its answer,
// and a retry with the same Idempotency-Key gets that answer.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("shopd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8080", "address to listen on")
	dataDir := fs.String("data", "./shopdata", "directory of the SQLite database when -db is not given (short for -db sqlite:DIR/shop.db)")
	dbFlag := fs.String("db", "", "database of the orders and the idempotency records: sqlite:PATH, postgres://user:pass@host:port/db, "+
		"mysql://user:pass@host:port/db or mysql:DSN (a go-sql-driver DSN) (default sqlite:DATA/shop.db)")
	redisFlag := fs.String("redis", "", "redis://[user:pass@]host:port/db: put Redis in front of the database (tieredstore); empty: the database alone")
	lease := fs.Duration("lease", idem.DefaultLease, "how long a request holds its Idempotency-Key before a retry may take it over (renewed while it runs); "+
		"a request whose shopd died is resumed by a retry after that")
	wait := fs.Duration("wait", 0, "how long a retry waits for an in-flight first request before 409 (0: answer 409 at once)")
	catalogFlag := fs.String("catalog", "", "JSON file of the catalogue a fresh database starts with (default: SKU-1, BOOK-1 and coupon 1)")
	paySecret := fs.String("pay-secret", "", "secret of payment callbacks' Pay-Signature (HMAC-SHA256), shared with the payment provider "+
		"(default: $"+paySecretEnv+", else "+DevPaySecret+", which anyone can read); prefer the environment variable, which ps does not show")
	payTimeout := fs.Duration("pay-timeout", DefaultPayTimeout, "how long an order may wait for its payment; the close job then closes it and gives its stock and coupon back")
	brokerFlag := fs.String("broker", "", "broker of the order events: nats://host:port (NATS JetStream) or amqp://user:pass@host:port/vhost (RabbitMQ) "+
		"(default: a NATS server with JetStream embedded in shopd, on a free loopback port, storing under -nats-store)")
	natsStore := fs.String("nats-store", "", "directory of the embedded NATS server's streams (default: nats next to the SQLite file, DATA/nats; for a server -db, ./shopdata/nats); "+
		"when another shopd on this host holds the default one, the first free of nats.2, nats.3, …")
	eventsFlag := fs.String("events", DefaultEvents, "namespace `NAME` of the order events' names on the broker (a-z, 0-9 and '-', starting with a letter, at most 32): "+
		"NATS stream NAME_ORDERS on NAME.order.>, consumer NAME-loyalty; RabbitMQ exchange NAME.events, queue NAME-loyalty; dead letters NAME_ORDERS_DEAD, NAME-loyalty.dead. "+
		"Shops that share a broker need different ones")
	eventPrefix := fs.String("event-prefix", DefaultEventIDPrefix, "readable prefix of the order events' message IDs (the rest, fixed when an event is written, makes each unique across databases)")
	eventRetention := fs.Duration("event-retention", DefaultRetention, "how long sent events (idem_outbox) and the loyalty consumer's finished records (idem_inbox) are kept; "+
		"at least 1h, and longer than the broker may redeliver a message (a redelivery after its record went is handled again)")
	adminToken := fs.String("admin-token", "", "token of the operator page at /admin/ (at least 16 bytes; default $"+adminTokenEnv+"; "+
		"neither: the page is off); prefer the environment variable, which ps does not show")
	adminLogKeys := fs.Bool("admin-log-keys", false, "log the raw idempotency key and message ID of the operator page's actions (default: their hash only)")
	providerFlag := fs.String("provider", "", "base URL of the payment provider that refunds (http://host:port; default $"+providerEnv+"; "+
		"neither: a simulated provider (payprov) embedded in shopd, on a free loopback port, its URL logged)")
	providerTimeout := fs.Duration("provider-timeout", defaultProviderTimeout, "longest wait for one call to the payment provider; "+
		"a refund whose call times out answers 503 PROVIDER_UNAVAILABLE and is resumed by a retry or the completer")
	completeInterval := fs.Duration("complete-interval", defaultCompleteInterval, "how often the completer looks for refunds whose client stopped retrying, and finishes them")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	readTimeout := fs.Duration("read-timeout", defaultReadTimeout,
		"longest time to read a request, headers and body; a slower client's connection is closed")
	writeTimeout := fs.Duration("write-timeout", defaultWriteTimeout,
		"longest time from the end of a request's headers to the end of its answer; must exceed -read-timeout plus -wait "+
			"(unset: -read-timeout + -wait + 30s when that is longer than the default)")
	idleTimeout := fs.Duration("idle-timeout", defaultIdleTimeout,
		"how long a keep-alive connection may wait for its next request")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("shopd: unexpected arguments %q", fs.Args())
	}
	if *addr == "" {
		// net.Listen would take every interface and a random port.
		return errors.New("shopd: -addr must be host:port (127.0.0.1:8080, or :8080 for every interface)")
	}
	if *lease < time.Second || *lease > time.Hour {
		return errors.New("shopd: -lease must be from 1s to 1h")
	}
	if *wait < 0 {
		return fmt.Errorf("shopd: -wait must not be negative")
	}
	if *providerTimeout <= 0 {
		return errors.New("shopd: -provider-timeout must be positive")
	}
	if *completeInterval <= 0 {
		return errors.New("shopd: -complete-interval must be positive")
	}
	if set := flagSet(fs); set["provider"] && *providerFlag == "" {
		return errors.New("shopd: -provider must not be empty (leave it out for $" + providerEnv + " or the embedded provider)")
	}
	providerURL := *providerFlag
	if providerURL == "" {
		providerURL = os.Getenv(providerEnv)
	}
	if providerURL != "" {
		if err := checkProviderURL(providerURL); err != nil {
			return err
		}
	}
	crashStep, err := crashAfterStep()
	if err != nil {
		return err
	}
	if *payTimeout <= 0 || *payTimeout > MaxPayTimeout {
		return fmt.Errorf("shopd: -pay-timeout must be positive and at most %v", MaxPayTimeout)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"read-timeout", *readTimeout}, {"write-timeout", *writeTimeout}, {"idle-timeout", *idleTimeout}} {
		if d.v <= 0 {
			return fmt.Errorf("shopd: -%s must be positive", d.name)
		}
	}
	// The write deadline counts from the end of a request's headers: it
	// must leave room for the body (-read-timeout) and a retry's wait, or
	// a slow client's order is created and its answer cannot be written.
	set := flagSet(fs)
	const maxTimeout = 24 * time.Hour
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"read-timeout", *readTimeout}, {"wait", *wait}} {
		if d.v > maxTimeout {
			return fmt.Errorf("shopd: -%s must not exceed %v", d.name, maxTimeout)
		}
	}
	if !set["write-timeout"] {
		*writeTimeout = max(defaultWriteTimeout, *readTimeout+*wait+writeMargin)
	}
	if *writeTimeout <= *readTimeout+*wait {
		return fmt.Errorf("shopd: -write-timeout (%v) must be longer than -read-timeout (%v) plus -wait (%v): "+
			"it counts from a request's headers, so a slow body or a waiting retry would leave its answer unwritten", *writeTimeout, *readTimeout, *wait)
	}
	broker, err := parseBroker(*brokerFlag)
	if err != nil {
		return fmt.Errorf("shopd: %w", err)
	}
	if set["broker"] && *brokerFlag == "" {
		return errors.New("shopd: -broker must not be empty (leave it out for the embedded NATS server)")
	}
	if err := checkEvents(*eventsFlag); err != nil {
		return fmt.Errorf("shopd: %w", err)
	}
	if *eventPrefix == "" {
		return errors.New("shopd: -event-prefix must not be empty")
	}
	if *eventRetention < minEventRetention {
		return fmt.Errorf("shopd: -event-retention must be at least %v (longer than the broker may redeliver a message)", minEventRetention)
	}
	if set["nats-store"] && *natsStore == "" {
		return errors.New("shopd: -nats-store must not be empty")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("shopd: -log-level: %w", err)
	}
	rawDB := *dbFlag
	switch {
	case set["db"] && set["data"]:
		return errors.New("shopd: give -db or -data, not both (-data DIR is short for -db sqlite:DIR/shop.db)")
	case !set["db"]:
		if *dataDir == "" {
			return errors.New("shopd: -data must not be empty")
		}
		rawDB = "sqlite:" + filepath.Join(*dataDir, "shop.db")
	}
	target, err := dsn.ParseDB(rawDB)
	if err != nil {
		return fmt.Errorf("shopd: -db: %w", err)
	}
	if *natsStore == "" {
		// Next to the SQLite file; for a server database, under -data's
		// default.
		*natsStore = filepath.Join(*dataDir, "nats")
		if target.Dialect == sqlstore.SQLite {
			*natsStore = filepath.Join(filepath.Dir(target.SQLitePath), "nats")
		}
	}
	var redisOpts *redis.Options
	redisDisplay := ""
	if *redisFlag != "" {
		if redisOpts, redisDisplay, err = dsn.ParseRedis(*redisFlag); err != nil {
			return fmt.Errorf("shopd: -redis %w", err)
		}
	} else if set["redis"] {
		return errors.New("shopd: -redis must not be empty (leave it out to run without Redis)")
	}
	catalog := DefaultCatalog()
	if set["catalog"] {
		if *catalogFlag == "" {
			return errors.New("shopd: -catalog must name a JSON file (leave it out for the default catalogue)")
		}
		if catalog, err = ReadCatalog(*catalogFlag); err != nil {
			return fmt.Errorf("shopd: %w", err)
		}
	}
	secret, secretFrom, err := choosePaySecret(set["pay-secret"], *paySecret)
	if err != nil {
		return err
	}
	if set["admin-token"] && *adminToken == "" {
		return errors.New("shopd: -admin-token must not be empty (leave it out to use $" + adminTokenEnv + ", or for no operator page)")
	}
	if !set["admin-token"] {
		*adminToken = os.Getenv(adminTokenEnv)
	}
	if *adminToken != "" && len(*adminToken) < admin.MinTokenLen {
		return fmt.Errorf("shopd: the operator page's token must be at least %d bytes", admin.MinTokenLen)
	}
	if err := tracing.CheckEnv(); err != nil {
		return fmt.Errorf("shopd: OpenTelemetry export: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	// Listen before touching any data: an address in use or nonsense ends
	// shopd with no database created or migrated.
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("shopd: -addr %s: %w", *addr, err)
	}
	defer ln.Close()

	// A stop requested while shopd starts (a database that is slow to
	// answer, a long migration) ends it cleanly: the step it interrupted
	// fails with the context's error, which is no failure to start.
	stopped := func(err error) error {
		if ctx.Err() == nil {
			return err
		}
		log.Info("shopd: stopped before serving", "error", err)
		return nil
	}
	if ctx.Err() != nil {
		return stopped(ctx.Err())
	}
	db, err := target.Open(ctx)
	if err != nil {
		return stopped(fmt.Errorf("shopd: open database: %w", err))
	}
	defer db.Close()
	sqlStore, err := sqlstore.New(db, &sqlstore.Config{Dialect: target.Dialect, Logger: log})
	if err != nil {
		return err
	}
	if err := sqlStore.Migrate(ctx); err != nil {
		return stopped(fmt.Errorf("shopd: migrate idempotency store: %w", err))
	}
	if err := Migrate(ctx, db, target.Dialect); err != nil {
		return stopped(fmt.Errorf("shopd: %w", err))
	}
	if err := Seed(ctx, db, target.Dialect, catalog); err != nil {
		if errors.Is(err, ErrCatalogMismatch) {
			return fmt.Errorf("shopd: -catalog: %w", err)
		}
		return stopped(fmt.Errorf("shopd: %w", err))
	}
	var store idem.Store = sqlStore
	if redisOpts != nil {
		rdb := redis.NewClient(redisOpts)
		defer rdb.Close()
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if err := rdb.Ping(pctx).Err(); err != nil {
			// The tiered store runs on the database alone while Redis is away.
			log.Warn("shopd: Redis does not answer; serving from the database until it does", "redis", redisDisplay, "error", err)
		}
		cancel()
		if store, err = tieredstore.New(rdb, sqlStore, &tieredstore.Config{Logger: log}); err != nil {
			return fmt.Errorf("shopd: %w", err)
		}
	}
	if secretFrom == "" {
		log.Warn("shopd: payment callbacks are signed with the development secret "+DevPaySecret+
			", which anyone can read; give -pay-secret or "+paySecretEnv+" in production", "secret", DevPaySecret)
	} else {
		log.Info("shopd: payment callbacks are verified with the secret of "+secretFrom, "from", secretFrom)
	}
	storeName := target.Dialect.String()
	if redisOpts != nil {
		storeName = "tiered"
	}
	reg, obs, err := newMetrics()
	if err != nil {
		return fmt.Errorf("shopd: %w", err)
	}
	// Spans go to the OTLP endpoint when OTEL_EXPORTER_OTLP_ENDPOINT is
	// set; they are flushed after everything else stopped.
	traces, err := tracing.Start(ctx, "shopd")
	if err != nil {
		return fmt.Errorf("shopd: OpenTelemetry export: %w", err)
	}
	defer func() {
		tctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := traces.Shutdown(tctx); err != nil {
			log.Warn("shopd: OpenTelemetry export: spans lost at shutdown", "error", err)
		}
	}()

	// The metrics, the operator page's live counters and the spans hear
	// the same decisions: the requests', the store calls', the loyalty
	// consumer's and the relay's.
	counters := &admin.Counters{}
	observer := idem.Observers(obs, counters, traces.Observer())
	if providerURL == "" {
		// Its state lives next to the SQLite file, so that a refund
		// resumed after a restart meets the provider that made it.
		state := ""
		if target.Dialect == sqlstore.SQLite {
			state = filepath.Join(filepath.Dir(target.SQLitePath), "payprov.json")
		}
		stopProvider, url, err := startProvider(log, state)
		if err != nil {
			return fmt.Errorf("shopd: embedded payment provider: %w", err)
		}
		defer stopProvider()
		providerURL = url
		log.Info("shopd: refunds go to the embedded payment provider (payprov); give -provider or "+providerEnv+" for a real one", "provider", url)
	}
	provider := &payprov.Client{BaseURL: providerURL, HTTP: &http.Client{Timeout: *providerTimeout}}
	shop, err := New(Config{DB: db, Dialect: target.Dialect, Store: store, Lease: *lease, Wait: *wait, Logger: log, PaySecret: secret, EventIDPrefix: *eventPrefix,
		Observer: observer, StoreName: storeName, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		Provider: provider, Steps: &steps.Config{Interval: *completeInterval}, AfterStep: crashStep})
	if err != nil {
		return err
	}
	defer shop.Close()
	// The completer finishes refunds their clients left; it stops before
	// the shop and the database close.
	if err := shop.Runner().Start(); err != nil {
		return fmt.Errorf("shopd: %w", err)
	}
	defer shop.Runner().Close()
	// The close job runs in every instance; it stops before the database
	// closes.
	closer, err := shop.NewCloser(&CloserConfig{PayTimeout: *payTimeout, Retention: *eventRetention})
	if err != nil {
		return fmt.Errorf("shopd: %w", err)
	}
	closer.Start()
	defer closer.Close()

	// The outbox relay and the loyalty consumer stop (deferred) after the
	// HTTP server drained and before the database closes.
	events, err := startEvents(ctx, eventsConfig{target: broker, names: newTopology(*eventsFlag), storeDir: *natsStore, storeExplicit: set["nats-store"], shop: shop, db: db, dialect: target.Dialect, log: log, observer: observer})
	if err != nil {
		return stopped(fmt.Errorf("shopd: events: %w", err))
	}
	defer events.stop()

	// The operator page, at /admin/ (404 without a token).
	adminInbox, err := sqlstore.NewInboxStore(db, &sqlstore.Config{Dialect: target.Dialect})
	if err != nil {
		return err
	}
	defer adminInbox.Close()
	adminPage, err := admin.New(&admin.Config{
		Token: *adminToken, Name: "shopd", Logger: log, LogKeys: *adminLogKeys,
		Counters: counters, Store: store, Records: sqlStore, Messages: adminInbox,
		Retry: func(ctx context.Context, group, id string) error {
			return shop.RetryEvent(ctx, adminInbox, group, id)
		},
		RetryHelp: RetryHelp, Held: shop.HeldPayments, HeldNote: HeldNote,
		// Refunds and card checkouts that keep failing end dead: listed,
		// and retried from the page.
		Operations: shop.Runner().Journal(),
	})
	if err != nil {
		return fmt.Errorf("shopd: %w", err)
	}
	handler := http.NewServeMux()
	handler.Handle("/admin/", adminPage)
	handler.Handle("/", shop)
	srv := &http.Server{
		Handler:           traces.Handler(handler),
		ReadHeaderTimeout: min(maxReadHeaderTimeout, *readTimeout),
		ReadTimeout:       *readTimeout,
		WriteTimeout:      *writeTimeout,
		IdleTimeout:       *idleTimeout,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	if ctx.Err() != nil {
		return stopped(ctx.Err())
	}
	base := "http://" + ln.Addr().String()
	where := target.Display
	if redisDisplay != "" {
		where += ", cache " + redisDisplay
	}
	fmt.Fprintf(stdout, "shopd listening on %s (database %s)\nevents: %s\npayment provider: %s\n\nTry it:\n"+
		"  curl -i -X POST %s/orders -H 'X-User-ID: 1' -H 'Idempotency-Key: order-1' \\\n"+
		"       -H 'Content-Type: application/json' -d '{\"sku\":\"BOOK-1\",\"quantity\":2}'\n"+
		"  (run it again: the same order comes back with Idempotent-Replayed: true)\n"+
		"  curl -s %s/orders -H 'X-User-ID: 1'\n", base, where, events.display, providerURL, base, base)

	if *adminToken != "" {
		fmt.Fprintf(stdout, "operator page: %s/admin/ (token of -admin-token or $%s)\n", base, adminTokenEnv)
	}
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
		if errors.Is(err, context.DeadlineExceeded) {
			return errDrainIncomplete
		}
		return fmt.Errorf("shopd: shutdown: %w", err)
	}
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shopd: serve: %w", err)
	}
	log.Info("shopd: stopped")
	return nil
}

// adminTokenEnv is the environment variable of the operator page's
// token, read when -admin-token is not given.
const adminTokenEnv = "SHOPD_ADMIN_TOKEN"

// minEventRetention bounds -event-retention from below: an hour, far
// longer than NATS's 2-minute de-duplication window and the consumer's
// 30 s AckWait.
const minEventRetention = time.Hour

// paySecretEnv is the environment variable of the payment callbacks'
// secret, read when -pay-secret is not given.
const paySecretEnv = "SHOPD_PAY_SECRET"

// choosePaySecret returns the payment callbacks' secret and where it came
// from: -pay-secret when given (it must not be empty), else
// $SHOPD_PAY_SECRET when set and not empty, else DevPaySecret (from "").
func choosePaySecret(flagSet bool, flagValue string) (secret, from string, err error) {
	if flagSet {
		if flagValue == "" {
			return "", "", errors.New("shopd: -pay-secret must not be empty (leave it out to use $" + paySecretEnv + ")")
		}
		return flagValue, "-pay-secret", nil
	}
	if v := os.Getenv(paySecretEnv); v != "" {
		return v, paySecretEnv, nil
	}
	return DevPaySecret, "", nil
}

// newMetrics returns shopd's Prometheus registry, with the Go runtime's
// and the process's collectors, and the idem Observer registered in it.
func newMetrics() (*prometheus.Registry, *idemprom.Observer, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	obs, err := idemprom.New(reg, nil)
	return reg, obs, err
}
