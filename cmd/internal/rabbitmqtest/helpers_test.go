package rabbitmqtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // "pgx" for testdb.Postgres
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/rabbitmq"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

// broker is a test's own queue and dead-letter queue on the RabbitMQ of
// testenv, deleted when the test ends, and an admin channel.
type broker struct {
	url   string
	queue string // consumed
	dlq   string // the dead-letter queue (through the default exchange)
	ch    *amqp.Channel
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// newBroker declares a queue and a dead-letter queue of the test's own.
// args are the main queue's arguments (e.g. quorum).
func newBroker(t testing.TB, args amqp.Table) *broker {
	t.Helper()
	url := testenv.RabbitMQ.Need(t)
	conn, err := amqp.Dial(url)
	if err != nil {
		testenv.Unavailable(t, testenv.RabbitMQ.Name, testenv.RabbitMQ.Var, err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	b := &broker{url: url, queue: randomName("idem-test-"), ch: ch}
	b.dlq = b.queue + ".dead"
	durable := args["x-queue-type"] == "quorum"
	for _, q := range []struct {
		name string
		args amqp.Table
	}{{b.queue, args}, {b.dlq, nil}} {
		if _, err := ch.QueueDeclare(q.name, durable, false, false, false, q.args); err != nil {
			t.Fatalf("declare %s: %v", q.name, err)
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

// publish sends a message with id (none if empty) to the test's queue.
func (b *broker) publish(t testing.TB, id string, body string) {
	t.Helper()
	err := b.ch.PublishWithContext(t.Context(), "", b.queue, true, false, amqp.Publishing{
		MessageId: id, Body: []byte(body), DeliveryMode: amqp.Persistent,
	})
	if err != nil {
		t.Fatal(err)
	}
}

// depth returns the ready messages of queue and its consumers.
func (b *broker) depth(t testing.TB, queue string) (messages, consumers int) {
	t.Helper()
	q, err := b.ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspect %s: %v", queue, err)
	}
	return q.Messages, q.Consumers
}

// drain returns the messages of queue (acked).
func (b *broker) drain(t testing.TB, queue string) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	for {
		d, ok, err := b.ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// consumerConfig is a consumer of b's queue that dead-letters to b's dlq.
func (b *broker) consumerConfig() rabbitmq.ConsumerConfig {
	return rabbitmq.ConsumerConfig{
		URL: b.url, Queue: b.queue, DeadLetterRoutingKey: b.dlq,
		ReconnectDelay: 50 * time.Millisecond, MaxReconnect: time.Second,
	}
}

// run runs a consumer until the test ends, or until stop (which returns
// once Run returned).
func run(t testing.TB, cfg rabbitmq.ConsumerConfig, h rabbitmq.HandleFunc) (stop func()) {
	t.Helper()
	c, err := rabbitmq.NewConsumer(&cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// seen records what a HandleFunc answered for each delivery.
type seen struct {
	mu   sync.Mutex
	list []delivery
}

type delivery struct {
	id          string
	redelivered string
	result      inbox.Result
	attempt     int
}

func (s *seen) wrap(h rabbitmq.HandleFunc) rabbitmq.HandleFunc {
	return func(ctx context.Context, m inbox.Message) (inbox.Outcome, error) {
		o, err := h(ctx, m)
		s.mu.Lock()
		s.list = append(s.list, delivery{m.ID, m.Headers[rabbitmq.HeaderRedelivered], o.Result, o.Attempt})
		s.mu.Unlock()
		return o, err
	}
}

func (s *seen) all() []delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]delivery(nil), s.list...)
}

func (s *seen) count(r inbox.Result) int {
	n := 0
	for _, d := range s.all() {
		if d.result == r {
			n++
		}
	}
	return n
}

// eventually polls cond until it holds, or fails t after timeout.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// store is an inbox's SQL store and database with an effects table.
type store struct {
	db      *sql.DB
	addr    string
	dialect sqlstore.Dialect
	s       *sqlstore.InboxStore
}

func sqliteStore(t testing.TB) *store {
	t.Helper()
	path := filepath.Join(t.TempDir(), "inbox.db")
	db, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return setupStore(t, db, path, sqlstore.SQLite)
}

func postgresStore(t testing.TB) *store {
	t.Helper()
	db, addr := testdb.Postgres(t)
	db.SetMaxOpenConns(8)
	return setupStore(t, db, addr, sqlstore.PostgreSQL)
}

func openStore(t testing.TB, dialect, addr string) *store {
	t.Helper()
	if dialect == sqlstore.SQLite.String() {
		db, err := sqlite.Open(context.Background(), addr)
		if err != nil {
			t.Fatal(err)
		}
		return setupStore(t, db, addr, sqlstore.SQLite)
	}
	db, err := sql.Open("pgx", addr)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(8)
	return setupStore(t, db, addr, sqlstore.PostgreSQL)
}

func setupStore(t testing.TB, db *sql.DB, addr string, d sqlstore.Dialect) *store {
	t.Helper()
	s, err := sqlstore.NewInboxStore(db, &sqlstore.Config{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS effects (message_id TEXT NOT NULL, process TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &store{db: db, addr: addr, dialect: d, s: s}
}

func (s *store) inbox(t testing.TB, cfg inbox.Config) *inbox.Inbox {
	t.Helper()
	if cfg.Group == "" {
		cfg.Group = "loyalty"
	}
	in, err := inbox.New(s.s, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func (s *store) rebind(q string) string {
	if s.dialect != sqlstore.PostgreSQL {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$")
			b.WriteString(string(rune('0' + n)))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// effect is a TxHandler that writes one effects row.
func (s *store) effect(process string) inbox.TxHandler {
	q := s.rebind(`INSERT INTO effects (message_id, process) VALUES (?, ?)`)
	return func(ctx context.Context, tx *sql.Tx, d inbox.Delivery) error {
		_, err := tx.ExecContext(ctx, q, d.ID, process)
		return err
	}
}

// effects returns the effect rows, and the distinct message IDs among them.
func (s *store) effects(t testing.TB) (rows, distinct int) {
	t.Helper()
	if err := s.db.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT message_id) FROM effects`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	return rows, distinct
}

func (s *store) effectsOf(t testing.TB, id string) int {
	t.Helper()
	var n int
	if err := s.db.QueryRow(s.rebind(`SELECT COUNT(*) FROM effects WHERE message_id = ?`), id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func newPublisher(t testing.TB, cfg rabbitmq.PublisherConfig) *rabbitmq.Publisher {
	t.Helper()
	p, err := rabbitmq.NewPublisher(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}
