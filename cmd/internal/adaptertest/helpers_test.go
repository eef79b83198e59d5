package adaptertest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // "pgx" for testdb.Postgres
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/natsjs"
	"github.com/idemkit/idem/rabbitmq"
	"github.com/idemkit/idem/redisstore"
	"github.com/idemkit/idem/sqlstore"
)

func randName() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// A broker is a test's own stream or queue on one of the machine's
// brokers, with a dead-letter stream or queue, deleted when the test
// ends.
type broker interface {
	// publish publishes a message with id and payload; the broker holds
	// it even if it holds one with that id already.
	publish(t testing.TB, id, payload string)
	// consume runs the adapter's consumer with the adapter's Handle(in,
	// h) until the test ends; each outcome is recorded in rec.
	consume(t testing.TB, in *inbox.Inbox, h inbox.Handler, rec *outcomes)
	// consumeDefaults runs the adapter's consumer with p and the
	// adapter's default settings until the test ends.
	consumeDefaults(t testing.TB, p inbox.Process)
	// dead returns the dead letters, as id → reason.
	dead(t testing.TB) map[string]string
	// settled reports whether nothing is left to deliver or to ack.
	settled(t testing.TB) bool
}

// brokers are the brokers the tests run through.
var brokers = []struct {
	name string
	open func(testing.TB) broker
}{
	{"NATS", openNATS},
	{"RabbitMQ", openRabbitMQ},
}

// stores are the inbox stores the tests run with.
var stores = []struct {
	name string
	open func(testing.TB) inbox.Store
}{
	{"PostgreSQL", openPostgres},
	{"Redis", openRedis},
}

// outcomes records the outcome of each delivery, by message ID.
type outcomes struct {
	mu   sync.Mutex
	byID map[string][]inbox.Result
}

func (r *outcomes) add(id string, res inbox.Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byID == nil {
		r.byID = map[string][]inbox.Result{}
	}
	r.byID[id] = append(r.byID[id], res)
}

// of returns the outcomes of id, e.g. "[retry retry processed]".
func (r *outcomes) of(id string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprint(r.byID[id])
}

// acked counts the outcomes of id that ack the delivery.
func (r *outcomes) acked(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, res := range r.byID[id] {
		if res.Ack() {
			n++
		}
	}
	return n
}

// n counts the outcomes of id that are res.
func (r *outcomes) n(id string, res inbox.Result) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, x := range r.byID[id] {
		if x == res {
			n++
		}
	}
	return n
}

func (r *outcomes) count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byID[id])
}

func (r *outcomes) wrap(p func(context.Context, inbox.Message) (inbox.Outcome, error)) func(context.Context, inbox.Message) (inbox.Outcome, error) {
	return func(ctx context.Context, m inbox.Message) (inbox.Outcome, error) {
		o, err := p(ctx, m)
		r.add(m.ID, o.Result)
		return o, err
	}
}

// runUntilCleanup runs run until the test ends.
func runUntilCleanup(t testing.TB, run func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// ---- NATS JetStream

// dupWindow is the streams' Duplicates window, the shortest the server
// takes: a message published again after it is stored again.
const dupWindow = 100 * time.Millisecond

type natsBroker struct {
	js      jetstream.JetStream
	stream  string
	subject string
	deadS   string
	cons    *natsjs.Consumer
}

func openNATS(t testing.TB) broker {
	t.Helper()
	addr := testenv.NATS.Need(t)
	nc, err := nats.Connect(addr, nats.Name(t.Name()))
	if err != nil {
		testenv.Unavailable(t, testenv.NATS.Name, testenv.NATS.Var, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	n := randName()
	b := &natsBroker{js: js, stream: "HM_" + n, subject: "hm" + n, deadS: "HM_" + n + "_DEAD"}
	ctx := context.Background()
	for _, sc := range []jetstream.StreamConfig{
		{Name: b.stream, Subjects: []string{b.subject + ".>"}, Duplicates: dupWindow, Storage: jetstream.MemoryStorage},
		{Name: b.deadS, Subjects: []string{natsjs.DefaultDeadLetterPrefix + b.stream + ".>"}, Storage: jetstream.MemoryStorage},
	} {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatalf("create stream %s: %v", sc.Name, err)
		}
		t.Cleanup(func() { _ = js.DeleteStream(context.Background(), sc.Name) })
	}
	return b
}

func (b *natsBroker) publish(t testing.TB, id, payload string) {
	t.Helper()
	for range 200 {
		m := nats.NewMsg(b.subject + ".order.paid")
		m.Data = []byte(payload)
		ack, err := b.js.PublishMsg(context.Background(), m, jetstream.WithMsgID(id))
		if err != nil {
			t.Fatalf("publish %s: %v", id, err)
		}
		if !ack.Duplicate {
			return
		}
		time.Sleep(dupWindow / 4) // within the window: wait it out
	}
	t.Fatalf("the stream kept dropping %s as a duplicate", id)
}

func (b *natsBroker) consume(t testing.TB, in *inbox.Inbox, h inbox.Handler, rec *outcomes) {
	t.Helper()
	c, err := natsjs.NewConsumer(context.Background(), b.js, natsjs.Process(rec.wrap(natsjs.Handle(in, h))), &natsjs.Config{
		Stream: b.stream, Durable: "hm", Workers: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	b.cons = c
	runUntilCleanup(t, c.Run)
}

func (b *natsBroker) consumeDefaults(t testing.TB, p inbox.Process) {
	t.Helper()
	c, err := natsjs.NewConsumer(context.Background(), b.js, p, &natsjs.Config{Stream: b.stream, Durable: "defaults"})
	if err != nil {
		t.Fatal(err)
	}
	b.cons = c
	runUntilCleanup(t, c.Run)
}

func (b *natsBroker) dead(t testing.TB) map[string]string {
	t.Helper()
	ctx := context.Background()
	s, err := b.js.Stream(ctx, b.deadS)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		out[m.Header.Get(natsjs.DeadIDHeader)] = m.Header.Get(natsjs.DeadReasonHeader)
	}
	return out
}

func (b *natsBroker) settled(t testing.TB) bool {
	t.Helper()
	info, err := b.cons.JetStreamConsumer().Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.NumPending == 0 && info.NumAckPending == 0
}

// ---- RabbitMQ

type rabbitBroker struct {
	url   string
	ch    *amqp.Channel
	queue string
	dlq   string
}

func openRabbitMQ(t testing.TB) broker {
	t.Helper()
	addr := testenv.RabbitMQ.Need(t)
	conn, err := amqp.Dial(addr)
	if err != nil {
		testenv.Unavailable(t, testenv.RabbitMQ.Name, testenv.RabbitMQ.Var, err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	b := &rabbitBroker{url: addr, ch: ch, queue: "idem-hm-" + randName()}
	b.dlq = b.queue + ".dead"
	for _, q := range []string{b.queue, b.dlq} {
		if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
			t.Fatalf("declare %s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		for _, q := range []string{b.queue, b.dlq} {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
		_ = conn.Close()
	})
	return b
}

func (b *rabbitBroker) publish(t testing.TB, id, payload string) {
	t.Helper()
	err := b.ch.PublishWithContext(context.Background(), "", b.queue, true, false, amqp.Publishing{
		MessageId: id, Body: []byte(payload), DeliveryMode: amqp.Persistent,
	})
	if err != nil {
		t.Fatalf("publish %s: %v", id, err)
	}
}

func (b *rabbitBroker) consume(t testing.TB, in *inbox.Inbox, h inbox.Handler, rec *outcomes) {
	t.Helper()
	c, err := rabbitmq.NewConsumer(&rabbitmq.ConsumerConfig{
		URL: b.url, Queue: b.queue, DeadLetterRoutingKey: b.dlq, Workers: 2,
		ReconnectDelay: 50 * time.Millisecond, MaxReconnect: time.Second,
	}, rabbitmq.HandleFunc(rec.wrap(rabbitmq.Handle(in, h))))
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, c.Run)
}

func (b *rabbitBroker) consumeDefaults(t testing.TB, p inbox.Process) {
	t.Helper()
	c, err := rabbitmq.NewConsumer(&rabbitmq.ConsumerConfig{URL: b.url, Queue: b.queue, DeadLetterRoutingKey: b.dlq}, p)
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, c.Run)
}

func (b *rabbitBroker) dead(t testing.TB) map[string]string {
	t.Helper()
	out := map[string]string{}
	for {
		d, ok, err := b.ch.Get(b.dlq, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return out
		}
		out[d.MessageId] = fmt.Sprint(d.Headers[rabbitmq.HeaderDeadReason])
	}
}

// settled: the queue holds no ready message. (Unacked deliveries are not
// counted by the broker's queue depth: the tests also wait for every
// outcome they expect.)
func (b *rabbitBroker) settled(t testing.TB) bool {
	t.Helper()
	q, err := b.ch.QueueDeclarePassive(b.queue, false, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspect %s: %v", b.queue, err)
	}
	return q.Messages == 0
}

// ---- inbox stores

func openPostgres(t testing.TB) inbox.Store {
	t.Helper()
	db, _ := testdb.Postgres(t)
	return postgresInbox(t, db)
}

// postgresInbox is the migrated PostgreSQL inbox store on db, at most 4
// connections.
func postgresInbox(t testing.TB, db *sql.DB) *sqlstore.InboxStore {
	t.Helper()
	db.SetMaxOpenConns(4)
	s, err := sqlstore.NewInboxStore(db, &sqlstore.Config{Dialect: sqlstore.PostgreSQL})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func openRedis(t testing.TB) inbox.Store {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: testenv.Redis.Need(t), PoolSize: 8})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		testenv.Unavailable(t, testenv.Redis.Name, testenv.Redis.Var, err)
	}
	prefix := "idemtest-" + randName()
	s, err := redisstore.NewInboxStore(c, &redisstore.InboxConfig{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Unlink(ctx, iter.Val())
		}
	})
	return s
}

// ---- the external effect

// downstream is an external service the handler calls: it counts the
// effects applied per idempotency key and records each call's key, fence
// and attempt. It does not de-duplicate: a second effect of one key is
// counted, for the tests to see.
type downstream struct {
	mu      sync.Mutex
	applied map[string]int
	calls   map[string][]call
}

type call struct {
	id      string
	group   string
	fence   int64
	attempt int
}

func newDownstream() *downstream {
	return &downstream{applied: map[string]int{}, calls: map[string][]call{}}
}

// called records a call for d and returns how many calls d's ID had.
func (s *downstream) called(d inbox.Delivery) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[d.ID] = append(s.calls[d.ID], call{d.ID, d.Group, d.Fence, d.Attempt})
	return len(s.calls[d.ID])
}

// apply applies the effect of key.
func (s *downstream) apply(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.applied[key]++
}

func (s *downstream) effects(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied[key]
}

func (s *downstream) callsOf(key string) []call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]call(nil), s.calls[key]...)
}
