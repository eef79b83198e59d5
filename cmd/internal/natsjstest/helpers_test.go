package natsjstest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/natsjs"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

// env is a test's stream on the NATS server: its own name and subjects,
// and a dead-letter stream capturing the default dead-letter subjects of
// its consumers; both are deleted at cleanup.
type env struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	stream  string // e.g. T_1a2b3c
	subject string // the stream's subjects are subject + ".>"
	dead    string // the dead-letter stream
}

func randName() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	url := testenv.NATS.Need(t)
	nc, err := nats.Connect(url, nats.Name(t.Name()))
	if err != nil {
		testenv.Unavailable(t, testenv.NATS.Name, testenv.NATS.Var, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// setup creates the test's streams. window is the stream's Duplicates
// window (0: the server's default, 2 min).
func setup(t testing.TB, window time.Duration) env {
	t.Helper()
	nc, js := connect(t)
	name := randName()
	e := env{nc: nc, js: js, stream: "T_" + name, subject: "t" + name, dead: "T_" + name + "_DEAD"}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: e.stream, Subjects: []string{e.subject + ".>"}, Duplicates: window, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), e.stream) })
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: e.dead, Subjects: []string{natsjs.DefaultDeadLetterPrefix + e.stream + ".>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatalf("create dead-letter stream: %v", err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), e.dead) })
	return e
}

// publish publishes payload on the stream's subject sub with the
// message id id ("" for none) and returns the PubAck.
func (e env) publish(t testing.TB, sub, id string, payload string) *jetstream.PubAck {
	t.Helper()
	m := nats.NewMsg(e.subject + "." + sub)
	m.Data = []byte(payload)
	var opts []jetstream.PublishOpt
	if id != "" {
		opts = append(opts, jetstream.WithMsgID(id))
	}
	ack, err := e.js.PublishMsg(context.Background(), m, opts...)
	if err != nil {
		t.Fatalf("publish %s: %v", id, err)
	}
	return ack
}

func (e env) streamMsgs(t testing.TB, name string) uint64 {
	t.Helper()
	s, err := e.js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// settled reports whether the consumer has nothing left to deliver nor
// awaiting an ack.
func settled(t testing.TB, c *natsjs.Consumer) bool {
	t.Helper()
	info, err := c.JetStreamConsumer().Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.NumPending == 0 && info.NumAckPending == 0 && info.NumRedelivered == 0
}

// run runs c until the test ends (or stop is called) and checks that
// Run returned nil.
func run(t testing.TB, c *natsjs.Consumer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var stopped bool
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

// sqliteInbox opens a SQLite database of the test's own with the inbox's
// table and an effects table, and an inbox of group "loyalty" on it.
func sqliteInbox(t testing.TB, cfg inbox.Config) (*sql.DB, *sqlstore.InboxStore, *inbox.Inbox) {
	t.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "inbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	s, in := inboxOn(t, db, sqlstore.SQLite, cfg)
	return db, s, in
}

func inboxOn(t testing.TB, db *sql.DB, d sqlstore.Dialect, cfg inbox.Config) (*sqlstore.InboxStore, *inbox.Inbox) {
	t.Helper()
	s, err := sqlstore.NewInboxStore(db, &sqlstore.Config{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS effects (message_id TEXT NOT NULL, process TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if cfg.Group == "" {
		cfg.Group = "loyalty"
	}
	in, err := inbox.New(s, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, in
}

// minWindow is the shortest Duplicates window the server accepts.
const minWindow = 100 * time.Millisecond

// publishAgain publishes like publish, waiting out the stream's
// Duplicates window until the stream stores the message again.
func (e env) publishAgain(t testing.TB, sub, id, payload string) *jetstream.PubAck {
	t.Helper()
	for range 200 {
		if ack := e.publish(t, sub, id, payload); !ack.Duplicate {
			return ack
		}
		time.Sleep(minWindow / 4)
	}
	t.Fatalf("the stream kept dropping %s as a duplicate", id)
	return nil
}

// effect is a HandleTx handler writing one row of effects.
func effect(d sqlstore.Dialect, process string) inbox.TxHandler {
	q := `INSERT INTO effects (message_id, process) VALUES (?, ?)`
	if d == sqlstore.PostgreSQL {
		q = `INSERT INTO effects (message_id, process) VALUES ($1, $2)`
	}
	return func(ctx context.Context, tx *sql.Tx, dl inbox.Delivery) error {
		_, err := tx.ExecContext(ctx, q, dl.ID, process)
		return err
	}
}

// effects counts the effect rows, all and those of id.
func effects(t testing.TB, db *sql.DB, d sqlstore.Dialect, id string) (all, of int) {
	t.Helper()
	q := `SELECT COUNT(*), COALESCE(SUM(CASE WHEN message_id = ? THEN 1 ELSE 0 END), 0) FROM effects`
	if d == sqlstore.PostgreSQL {
		q = strings.Replace(q, "?", "$1", 1)
	}
	if err := db.QueryRow(q, id).Scan(&all, &of); err != nil {
		t.Fatal(err)
	}
	return all, of
}

func newConsumer(t testing.TB, e env, p natsjs.Process, cfg natsjs.Config) *natsjs.Consumer {
	t.Helper()
	cfg.Stream = e.stream
	if cfg.Durable == "" {
		cfg.Durable = "loyalty"
	}
	c, err := natsjs.NewConsumer(context.Background(), e.js, p, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// seqID is the inbox's ID of the message at seq in e's stream, which has
// no Nats-Msg-Id: "<stream>:<seq>:<the message's time in Unix ns>".
func seqID(t testing.TB, e env, seq uint64) string {
	t.Helper()
	s, err := e.js.Stream(context.Background(), e.stream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(context.Background(), seq)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s:%d:%d", e.stream, seq, m.Time.UnixNano())
}
