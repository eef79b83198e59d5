package shop

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/natsjs"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/rabbitmq"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/pgnotify"
)

// shopd's events: the outbox relay publishes the order events to a broker,
// and the loyalty consumer reads order.paid and order.refunded back from
// it into the shop's database (HandleLoyalty under inbox.HandleTx).
//
// Broker topology. NATS JetStream: the stream SHOP_ORDERS captures
// "shop.order.>" (de-duplicating by Nats-Msg-Id for 2 minutes), the
// durable pull consumer shop-loyalty reads all of it (the consumer ignores
// the events it has no use for), and its dead letters go to
// "idem.dead.SHOP_ORDERS.shop-loyalty", kept by the stream
// SHOP_ORDERS_DEAD. RabbitMQ: the durable topic exchange shop.events, the
// durable queue shop-loyalty bound to "shop.order.*" (the consumer ignores
// the events it has no use for; every event is routed, so the publisher's
// mandatory flag holds), and the queue shop-loyalty.dead for dead letters.
// shopd declares all of these at start-up; declaring them again is
// harmless.
const (
	natsStream      = "SHOP_ORDERS"
	natsDeadStream  = "SHOP_ORDERS_DEAD"
	natsSubjects    = "shop.order.>"
	amqpExchange    = "shop.events"
	amqpBinding     = "shop.order.*"
	amqpQueue       = LoyaltyGroup
	amqpDeadQueue   = LoyaltyGroup + ".dead"
	loyaltyAttempts = 5
)

// brokerTarget is a parsed -broker value.
type brokerTarget struct {
	// kind is "embedded", "nats" or "amqp".
	kind string
	url  string
	// display names the broker without its password.
	display string
}

// parseBroker parses -broker: "" (an embedded NATS server),
// nats://host:port, or amqp[s]://user:pass@host:port/vhost.
func parseBroker(raw string) (brokerTarget, error) {
	if raw == "" {
		return brokerTarget{kind: "embedded"}, nil
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return brokerTarget{}, fmt.Errorf("-broker %q: want nats://host:port or amqp://user:pass@host:port/vhost", redactURL(raw))
	}
	switch u.Scheme {
	case "nats", "tls":
		return brokerTarget{kind: "nats", url: raw, display: "NATS JetStream " + u.Redacted()}, nil
	case "amqp", "amqps":
		return brokerTarget{kind: "amqp", url: raw, display: "RabbitMQ " + u.Redacted()}, nil
	}
	return brokerTarget{}, fmt.Errorf("-broker %s: unknown scheme %q (want nats:// or amqp://)", u.Redacted(), u.Scheme)
}

// redactURL hides what could be a password in an unparsable URL.
func redactURL(raw string) string {
	if i := strings.LastIndexByte(raw, '@'); i >= 0 {
		return "…" + raw[i:]
	}
	return raw
}

// eventsConfig is what startEvents needs.
type eventsConfig struct {
	target brokerTarget
	// storeDir is the embedded NATS server's JetStream directory.
	storeDir string
	// storeExplicit: storeDir is -nats-store's, not a default.
	storeExplicit bool
	shop          *Shop
	db            *sql.DB
	dialect       sqlstore.Dialect
	log           *slog.Logger
}

// runningEvents is the relay and the loyalty consumer, running.
type runningEvents struct {
	// display says which broker shopd uses.
	display string
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	closers []func()
}

// stop stops the relay and the consumer, waits for them (the consumer
// settles the messages it is handling), and closes the broker's
// connections (and the embedded server), in that order.
func (r *runningEvents) stop() {
	r.cancel()
	r.wg.Wait()
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}
}

// startEvents connects to the broker (starting the embedded NATS server
// when -broker is not given), declares the stream or the queues, and
// starts the outbox relay and the loyalty consumer. They run until stop.
func startEvents(ctx context.Context, cfg eventsConfig) (_ *runningEvents, err error) {
	r := &runningEvents{display: cfg.target.display}
	defer func() {
		if err != nil {
			r.stop()
		}
	}()
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.cancel = cancel

	store, err := sqlstore.NewInboxStore(cfg.db, cfg.dialect)
	if err != nil {
		return nil, err
	}
	r.closers = append(r.closers, func() { store.Close() })
	if err := store.Prepare(ctx); err != nil {
		return nil, fmt.Errorf("loyalty inbox: %w", err)
	}
	in, err := inbox.New(store, &inbox.Config{Group: LoyaltyGroup, MaxAttempts: loyaltyAttempts})
	if err != nil {
		return nil, err
	}

	var pub outbox.Publisher
	var consume func(context.Context) error
	switch cfg.target.kind {
	case "embedded", "nats":
		natsURL := cfg.target.url
		if cfg.target.kind == "embedded" {
			dir, release, err := lockStore(cfg.storeDir, cfg.storeExplicit)
			if err != nil {
				return nil, err
			}
			r.closers = append(r.closers, release)
			ns, err := startEmbeddedNATS(dir)
			if err != nil {
				return nil, err
			}
			r.closers = append(r.closers, func() { ns.Shutdown(); ns.WaitForShutdown() })
			natsURL = ns.ClientURL()
			r.display = fmt.Sprintf("embedded NATS JetStream %s (store %s)", natsURL, dir)
		}
		nc, err := nats.Connect(natsURL, nats.Name("shopd"), nats.MaxReconnects(-1))
		if err != nil {
			return nil, fmt.Errorf("connect to NATS: %w", err)
		}
		r.closers = append(r.closers, nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			return nil, err
		}
		sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
		defer scancel()
		for _, sc := range []jetstream.StreamConfig{
			{Name: natsStream, Subjects: []string{natsSubjects}, Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute},
			{Name: natsDeadStream, Subjects: []string{"idem.dead." + natsStream + ".>"}, Storage: jetstream.FileStorage},
		} {
			if _, err := js.CreateOrUpdateStream(sctx, sc); err != nil {
				return nil, fmt.Errorf("NATS stream %s: %w", sc.Name, err)
			}
		}
		if pub, err = natsjs.NewPublisher(js, &natsjs.PublisherConfig{Stream: natsStream}); err != nil {
			return nil, err
		}
		// The whole stream (one filter subject: servers before 2.10 take
		// no more); HandleLoyalty ignores the events it has no use for.
		c, err := natsjs.NewConsumer(sctx, js, natsjs.HandleTx(in, cfg.db, cfg.shop.HandleLoyalty), &natsjs.Config{
			Stream: natsStream, Durable: LoyaltyGroup, Workers: 4, Logger: cfg.log,
		})
		if err != nil {
			return nil, fmt.Errorf("NATS consumer %s: %w", LoyaltyGroup, err)
		}
		consume = c.Run
	case "amqp":
		setup := func(ch *amqp.Channel) error {
			if err := ch.ExchangeDeclare(amqpExchange, "topic", true, false, false, false, nil); err != nil {
				return err
			}
			for _, q := range []string{amqpQueue, amqpDeadQueue} {
				if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
					return err
				}
			}
			return ch.QueueBind(amqpQueue, amqpBinding, amqpExchange, false, nil)
		}
		p, err := rabbitmq.NewPublisher(&rabbitmq.PublisherConfig{URL: cfg.target.url, Exchange: amqpExchange, Setup: setup})
		if err != nil {
			return nil, err
		}
		r.closers = append(r.closers, func() { p.Close() })
		pub = p
		c, err := rabbitmq.NewConsumer(&rabbitmq.ConsumerConfig{
			URL: cfg.target.url, Queue: amqpQueue, Setup: setup, Workers: 4,
			DeadLetterRoutingKey: amqpDeadQueue, Logger: cfg.log,
		}, rabbitmq.HandleTx(in, cfg.db, cfg.shop.HandleLoyalty))
		if err != nil {
			return nil, err
		}
		consume = c.Run
	default:
		return nil, fmt.Errorf("shop: unknown broker kind %q", cfg.target.kind)
	}

	// On PostgreSQL a commit that added events wakes the relay (NOTIFY);
	// elsewhere it polls.
	var events outbox.Store = cfg.shop.Outbox()
	if cfg.dialect == sqlstore.PostgreSQL {
		events = pgnotify.Outbox(cfg.shop.Outbox(), cfg.db)
	}
	relay, err := outbox.NewRelay(events, pub, &outbox.RelayConfig{PollInterval: relayPollInterval, Logger: cfg.log})
	if err != nil {
		return nil, err
	}
	r.wg.Go(func() { _ = relay.Run(runCtx) })
	r.wg.Go(func() {
		for runCtx.Err() == nil {
			if err := consume(runCtx); err != nil && runCtx.Err() == nil {
				cfg.log.Warn("shopd: loyalty consumer stopped; restarting", "error", err)
				select {
				case <-runCtx.Done():
				case <-time.After(time.Second):
				}
			}
		}
	})
	return r, nil
}

// relayPollInterval is how often the relay looks for new events when
// nothing wakes it (SQLite, MySQL).
const relayPollInterval = 500 * time.Millisecond

// errDirLocked: another shopd holds the embedded NATS store.
var errDirLocked = errors.New("in use by another shopd process")

// maxStoreSiblings bounds the stores tried next to a default one that is
// in use: DIR, DIR.2, … DIR.16.
const maxStoreSiblings = 16

// lockStore locks the embedded NATS server's store dir. When dir is the
// default (not -nats-store) and another shopd on this host holds it, it
// takes the first free of dir.2, dir.3, …: each instance keeps a store of
// its own, found again when it restarts.
func lockStore(dir string, explicit bool) (string, func(), error) {
	for i := 1; i <= maxStoreSiblings; i++ {
		d := dir
		if i > 1 {
			d = fmt.Sprintf("%s.%d", dir, i)
		}
		release, err := lockDir(d)
		switch {
		case err == nil:
			return d, release, nil
		case !errors.Is(err, errDirLocked) || explicit:
			return "", nil, fmt.Errorf("embedded NATS store %s: %w (give each shopd its own -nats-store, or share a broker with -broker)", d, err)
		}
	}
	return "", nil, fmt.Errorf("embedded NATS store %s and its %d siblings: %w", dir, maxStoreSiblings-1, errDirLocked)
}

// startEmbeddedNATS starts a NATS server with JetStream in this process,
// listening on a free loopback port, its streams stored under dir (which
// the caller locked).
func startEmbeddedNATS(dir string) (*server.Server, error) {
	ns, err := server.NewServer(&server.Options{
		ServerName: "shopd",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   dir,
		NoSigs:     true,
		NoLog:      true,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("embedded NATS: not ready after 30s")
	}
	return ns, nil
}
