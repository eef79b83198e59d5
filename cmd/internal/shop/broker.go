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

	"github.com/idemkit/idem"
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
// Broker topology. Every name derives from one namespace, -events NAME
// (default "shop"; see topology). NATS JetStream: the stream NAME_ORDERS
// (NAME in capitals, '-' as '_') captures "NAME.order.>" (de-duplicating
// by Nats-Msg-Id for 2 minutes), the durable pull consumer NAME-loyalty
// reads all of it (the consumer ignores the events it has no use for), and
// its dead letters go to "idem.dead.NAME_ORDERS.NAME-loyalty", kept by the
// stream NAME_ORDERS_DEAD. RabbitMQ: the durable topic exchange
// NAME.events, the durable queue NAME-loyalty bound to "NAME.order.*" (the
// consumer ignores the events it has no use for; every event is routed, so
// the publisher's mandatory flag holds), and the queue NAME-loyalty.dead
// for dead letters. shopd declares all of these at start-up; declaring
// them again is harmless.
const loyaltyAttempts = 5

// DefaultEvents is -events' default: the namespace of shopd's names on the
// broker, SHOP_ORDERS, shop.order.>, shop.events, shop-loyalty.
const DefaultEvents = "shop"

// maxEventsLen bounds -events: the longest name it derives
// (NAME_ORDERS_DEAD, idem.dead.NAME_ORDERS.NAME-loyalty) stays short.
const maxEventsLen = 32

// checkEvents reports whether name may be -events: 1 to 32 of a-z, 0-9 and
// '-', starting with a letter, a token that is safe in NATS subjects and
// stream names and in AMQP exchange and queue names.
func checkEvents(name string) error {
	ok := len(name) > 0 && len(name) <= maxEventsLen && name[0] >= 'a' && name[0] <= 'z'
	for _, c := range []byte(name) {
		ok = ok && (c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-')
	}
	if !ok {
		return fmt.Errorf("-events %q: want 1 to %d of a-z, 0-9 and '-', starting with a letter (e.g. %s, shop-eu)", name, maxEventsLen, DefaultEvents)
	}
	return nil
}

// topology is the broker names of the namespace name (-events).
type topology struct {
	name string
	// NATS: the stream and the dead letters' stream, their subjects, and
	// the durable consumer.
	stream, deadStream, subjects, deadSubjects, durable string
	// AMQP: the topic exchange, the queue's binding, the queue and the
	// dead-letter queue.
	exchange, binding, queue, deadQueue string
}

// newTopology derives every broker name from name, which checkEvents
// accepted.
func newTopology(name string) topology {
	stream := strings.ToUpper(strings.ReplaceAll(name, "-", "_")) + "_ORDERS"
	consumer := name + "-loyalty"
	return topology{
		name:         name,
		stream:       stream,
		deadStream:   stream + "_DEAD",
		subjects:     name + ".order.>",
		deadSubjects: "idem.dead." + stream + ".>",
		durable:      consumer,
		exchange:     name + ".events",
		binding:      name + ".order.*",
		queue:        consumer,
		deadQueue:    consumer + ".dead",
	}
}

// namedPublisher publishes the outbox's events in a namespace: a row's
// topic is the event's name ("order.paid"), published on NAME.order.paid
// (EventTopic). A row written before the topic was the event's name holds
// "shop.order.paid"; it is published in the namespace too.
type namedPublisher struct {
	ns   string
	next outbox.Publisher
}

func (p namedPublisher) Publish(ctx context.Context, m outbox.Message) error {
	m.Topic = EventTopic(p.ns, eventOfTopic(m.Topic))
	if err := p.next.Publish(ctx, m); err != nil {
		return err
	}
	if h := afterPublishHook; h != nil {
		h(m)
	}
	return nil
}

// legacyTopicPrefix starts the topic of the rows that shopd wrote before
// the row's topic was the event's name: "shop.order.paid".
const legacyTopicPrefix = "shop."

// eventOfTopic is the event an outbox row's topic names.
func eventOfTopic(topic string) string {
	if rest, ok := strings.CutPrefix(topic, legacyTopicPrefix); ok && strings.HasPrefix(rest, "order.") {
		return rest
	}
	return topic
}

// Hooks of the tests (export_test.go), nil in shopd. afterPublishHook
// runs after the broker confirmed an event and before the relay marks it
// sent; loyaltyHook after the loyalty consumer handled a message (its
// effect committed when the result is Processed) and before it is acked.
var (
	afterPublishHook func(outbox.Message)
	loyaltyHook      func(inbox.Message, inbox.Outcome)
	// loyaltyFailHook, when it returns an error, fails HandleLoyalty's
	// attempt at ev (before it writes anything).
	loyaltyFailHook func(ev OrderEvent) error
	// natsAckWait is the loyalty durable's AckWait; 0: natsjs's default.
	natsAckWait time.Duration
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
	// names is the broker topology (-events).
	names topology
	// storeDir is the embedded NATS server's JetStream directory.
	storeDir string
	// storeExplicit: storeDir is -nats-store's, not a default.
	storeExplicit bool
	shop          *Shop
	db            *sql.DB
	dialect       sqlstore.Dialect
	log           *slog.Logger
	// observer hears the loyalty consumer's messages and the relay's
	// batches and backlog; nil hears nothing.
	observer idem.Observer
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

	store, err := sqlstore.NewInboxStore(cfg.db, &sqlstore.Config{Dialect: cfg.dialect})
	if err != nil {
		return nil, err
	}
	r.closers = append(r.closers, func() { store.Close() })
	if err := store.Prepare(ctx); err != nil {
		return nil, fmt.Errorf("loyalty inbox: %w", err)
	}
	in, err := inbox.New(store, &inbox.Config{Group: LoyaltyGroup, MaxAttempts: loyaltyAttempts, Observer: cfg.observer})
	if err != nil {
		return nil, err
	}
	handle := func(ctx context.Context, m inbox.Message) (inbox.Outcome, error) {
		m.ID = cfg.shop.retriedID(m) // an event the operator page retried
		o, err := in.HandleTx(ctx, cfg.db, m, cfg.shop.HandleLoyalty)
		if h := loyaltyHook; h != nil && err == nil {
			h(m, o)
		}
		return o, err
	}
	names := cfg.names

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
			{Name: names.stream, Subjects: []string{names.subjects}, Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute},
			{Name: names.deadStream, Subjects: []string{names.deadSubjects}, Storage: jetstream.FileStorage},
		} {
			if _, err := js.CreateOrUpdateStream(sctx, sc); err != nil {
				return nil, fmt.Errorf("NATS stream %s: %w", sc.Name, err)
			}
		}
		if pub, err = natsjs.NewPublisher(js, &natsjs.PublisherConfig{Stream: names.stream}); err != nil {
			return nil, err
		}
		// The whole stream (one filter subject: servers before 2.10 take
		// no more); HandleLoyalty ignores the events it has no use for.
		c, err := natsjs.NewConsumer(sctx, js, handle, &natsjs.Config{
			Stream: names.stream, Durable: names.durable, Workers: 4, AckWait: natsAckWait, Logger: cfg.log,
		})
		if err != nil {
			return nil, fmt.Errorf("NATS consumer %s: %w", names.durable, err)
		}
		consume = c.Run
	case "amqp":
		setup := func(ch *amqp.Channel) error {
			if err := ch.ExchangeDeclare(names.exchange, "topic", true, false, false, false, nil); err != nil {
				return err
			}
			for _, q := range []string{names.queue, names.deadQueue} {
				if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
					return err
				}
			}
			return ch.QueueBind(names.queue, names.binding, names.exchange, false, nil)
		}
		p, err := rabbitmq.NewPublisher(&rabbitmq.PublisherConfig{URL: cfg.target.url, Exchange: names.exchange, Setup: setup})
		if err != nil {
			return nil, err
		}
		r.closers = append(r.closers, func() { p.Close() })
		pub = p
		c, err := rabbitmq.NewConsumer(&rabbitmq.ConsumerConfig{
			URL: cfg.target.url, Queue: names.queue, Setup: setup, Workers: 4,
			DeadLetterRoutingKey: names.deadQueue, Logger: cfg.log,
		}, handle)
		if err != nil {
			return nil, err
		}
		consume = c.Run
	default:
		return nil, fmt.Errorf("shop: unknown broker kind %q", cfg.target.kind)
	}

	if cfg.target.kind == "amqp" {
		r.display += fmt.Sprintf(", names %s (exchange %s, queue %s)", names.name, names.exchange, names.queue)
	} else {
		r.display += fmt.Sprintf(", names %s (stream %s, consumer %s)", names.name, names.stream, names.durable)
	}

	// On PostgreSQL a commit that added events wakes the relay (NOTIFY);
	// elsewhere it polls.
	var events outbox.Store = cfg.shop.Outbox()
	if cfg.dialect == sqlstore.PostgreSQL {
		events = pgnotify.Outbox(cfg.shop.Outbox(), cfg.db)
	}
	// The close job sweeps sent events (-event-retention), not the relay.
	relay, err := outbox.NewRelay(events, namedPublisher{ns: names.name, next: pub}, &outbox.RelayConfig{
		PollInterval: relayPollInterval, Retention: -1, Logger: cfg.log,
		Observer: cfg.observer, Name: names.name,
	})
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
