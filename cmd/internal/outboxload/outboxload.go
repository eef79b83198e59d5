// Package outboxload is the workload that the broker failover tests
// (natscluster, rabbitrestart) drive through a broker while they kill it:
// business transactions on PostgreSQL that each insert an order and add
// its event to the outbox (sqlstore's OutboxStore), a relay publishing
// them, an inbox consumer (HandleTx on sqlstore's InboxStore) writing one
// effect row per message into a table with no unique constraint on the
// message ID, and the invariants checked at the end: every committed
// event reached the broker, has exactly one effect row, and nothing was
// dead-lettered. It is test support, imported by tests only.
package outboxload

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/sqlstore"
)

// RoundsVar names the environment variable that sets how many times a
// failover test kills its server per case: 1 when unset (CI).
const RoundsVar = "IDEM_FAILOVER_ROUNDS"

// Rounds returns the kills per case that RoundsVar asks for, at least 1.
func Rounds(t testing.TB) int {
	t.Helper()
	v := os.Getenv(RoundsVar)
	if v == "" {
		return 1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", RoundsVar, v)
	}
	return n
}

// Keys is the number of business keys (orders) the events are spread
// over: the relay publishes the events of one key in order.
const Keys = 32

// Load is one test's database: orders, the outbox, the inbox and the
// effects table, in a PostgreSQL schema of the test's own.
type Load struct {
	DB     *sql.DB
	Outbox *sqlstore.OutboxStore
	Inbox  *inbox.Inbox
	topic  func(i int) string

	committed   atomic.Int64
	publishErrs atomic.Int64
	Tally       Tally
}

// New creates the tables in db, a PostgreSQL database (or schema) of the
// test's own; topic names the topic of the i-th event.
func New(t testing.TB, db *sql.DB, topic func(i int) string) *Load {
	t.Helper()
	db.SetMaxOpenConns(12)
	ctx := context.Background()
	ob, err := sqlstore.NewOutboxStore(db, &sqlstore.OutboxConfig{Dialect: sqlstore.PostgreSQL})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ob.Close() })
	is, err := sqlstore.NewInboxStore(db, &sqlstore.Config{Dialect: sqlstore.PostgreSQL})
	if err != nil {
		t.Fatal(err)
	}
	if err := is.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = is.Close() })
	in, err := inbox.New(is, &inbox.Config{Group: "effects"})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE orders (n BIGINT NOT NULL)`,
		// No unique constraint: a second effect of one message is a
		// second row, for the checks to count.
		`CREATE TABLE effects (message_id TEXT NOT NULL)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	return &Load{DB: db, Outbox: ob, Inbox: in, topic: topic}
}

// Handler is the consumer's Process: the inbox's HandleTx writing one
// effect row in the transaction that records the message consumed.
func (l *Load) Handler() inbox.Process {
	return l.Inbox.ProcessTx(l.DB, func(ctx context.Context, tx *sql.Tx, d inbox.Delivery) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO effects (message_id) VALUES ($1)`, d.ID)
		return err
	})
}

// Relay runs an outbox relay publishing with p until the test ends.
// Failed publishes are counted (PublishErrors) and retried after
// retry.
func (l *Load) Relay(t testing.TB, p outbox.Publisher, retry time.Duration) {
	t.Helper()
	counted := outbox.PublisherFunc(func(ctx context.Context, m outbox.Message) error {
		err := p.Publish(ctx, m)
		if err != nil {
			l.publishErrs.Add(1)
		}
		return err
	})
	r, err := outbox.NewRelay(l.Outbox, counted, &outbox.RelayConfig{
		PollInterval: 200 * time.Millisecond, RetryDelay: retry, Retention: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	RunUntilCleanup(t, "relay", r.Run)
}

// PublishErrors is the number of publishes the broker did not confirm.
func (l *Load) PublishErrors() int64 { return l.publishErrs.Load() }

// Produce commits a business transaction every interval until the
// returned stop is called; stop returns the number committed.
func (l *Load) Produce(t testing.TB, interval time.Duration) (stop func() int) {
	t.Helper()
	// The transactions run to their end under a context of their own:
	// one stopped mid-commit could commit and still return an error.
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := 0; ; i++ {
			if err := l.commit(context.Background(), i); err != nil {
				t.Errorf("business transaction %d: %v", i, err)
				return
			}
			select {
			case <-quit:
				return
			case <-tick.C:
			}
		}
	}()
	var once sync.Once
	stop = func() int {
		once.Do(func() { close(quit); <-done })
		return int(l.committed.Load())
	}
	t.Cleanup(func() { stop() })
	return stop
}

// commit inserts the i-th order and adds its event, in one transaction.
func (l *Load) commit(ctx context.Context, i int) error {
	tx, err := l.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (n) VALUES ($1)`, i); err != nil {
		return err
	}
	_, err = l.Outbox.Add(ctx, tx, outbox.Message{
		Topic: l.topic(i), Key: fmt.Sprint("order-", i%Keys), Payload: []byte(strconv.Itoa(i)),
	})
	if err != nil {
		return err
	}
	// A commit that fails after the database committed would leave an
	// order the count misses: the check compares with the orders table.
	if err := tx.Commit(); err != nil {
		return err
	}
	l.committed.Add(1)
	return nil
}

// Committed is the number of business transactions committed so far.
func (l *Load) Committed() int { return int(l.committed.Load()) }

func (l *Load) count(t testing.TB, q string) int {
	t.Helper()
	var n int
	if err := l.DB.QueryRow(q).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// Effects is the number of effect rows.
func (l *Load) Effects(t testing.TB) int { return l.count(t, `SELECT COUNT(*) FROM effects`) }

// Pending is the number of outbox messages not yet confirmed.
func (l *Load) Pending(t testing.TB) int {
	return l.count(t, `SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL`)
}

// WaitEffects waits until there are at least n effect rows.
func (l *Load) WaitEffects(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	Eventually(t, timeout, fmt.Sprintf("%d effect rows", n), func() bool { return l.Effects(t) >= n })
}

// Drain waits until every committed event was confirmed and has at
// least one effect row.
func (l *Load) Drain(t testing.TB, timeout time.Duration) {
	t.Helper()
	Eventually(t, timeout, "every event published and handled", func() bool { return l.Drained(t) })
}

// Drained reports whether every event committed so far was confirmed
// and has at least one effect row.
func (l *Load) Drained(t testing.TB) bool {
	t.Helper()
	return l.Pending(t) == 0 && l.count(t, `SELECT COUNT(DISTINCT message_id) FROM effects`) >= l.Committed()
}

// Status describes how far the load got, for a test that timed out
// waiting for it: events committed, still pending in the outbox, with
// an effect row, and the consumer's tally.
func (l *Load) Status(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("%d committed, %d pending in the outbox, %d with an effect row, %d publishes failed; deliveries: %v",
		l.Committed(), l.Pending(t), l.count(t, `SELECT COUNT(DISTINCT message_id) FROM effects`), l.PublishErrors(), l.Tally.Counts())
}

// IDs returns the IDs of the committed events.
func (l *Load) IDs(t testing.TB) []string {
	t.Helper()
	rows, err := l.DB.Query(`SELECT msg_id FROM idem_outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// Figures are what a run measured, for its log line and the docs.
type Figures struct {
	Committed     int // business transactions, events in the outbox
	InBroker      int // distinct events the broker held or delivered
	BrokerCopies  int // copies the broker held or delivered beyond one per event
	Effects       int // effect rows
	Doubled       int // events with more than one effect row
	Lost          int // committed events without an effect row, or not in the broker
	PublishErrors int64
	Settled       Counts
}

func (f Figures) String() string {
	return fmt.Sprintf("%d events committed, %d in the broker (%d extra copies), %d effect rows, %d doubled, %d lost; %d publishes failed and retried; deliveries: %v",
		f.Committed, f.InBroker, f.BrokerCopies, f.Effects, f.Doubled, f.Lost, f.PublishErrors, f.Settled)
}

// Check asserts the invariants once the load is drained: every
// committed event (an order with its outbox row) is in seen — the
// broker's copies of each event ID — and has exactly one effect row, no
// effect row names an unknown event, and no delivery was dead-lettered
// or terminated.
func (l *Load) Check(t testing.TB, seen map[string]int) Figures {
	t.Helper()
	f := Figures{Committed: l.Committed(), PublishErrors: l.PublishErrors(), Settled: l.Tally.Counts()}
	if n := l.count(t, `SELECT COUNT(*) FROM orders`); n != f.Committed {
		t.Errorf("%d orders, want the %d committed", n, f.Committed)
	}
	ids := l.IDs(t)
	if len(ids) != f.Committed {
		t.Errorf("%d outbox events, want the %d committed", len(ids), f.Committed)
	}
	if n := l.Pending(t); n != 0 {
		t.Errorf("%d outbox events still pending", n)
	}
	missing := 0
	for _, id := range ids {
		c := seen[id]
		if c == 0 {
			missing++
			if missing <= 5 {
				t.Errorf("committed event %s never reached the broker", id)
			}
			continue
		}
		f.InBroker++
		f.BrokerCopies += c - 1
	}
	f.Effects = l.Effects(t)
	f.Doubled = l.count(t, `SELECT COUNT(*) FROM (SELECT message_id FROM effects GROUP BY message_id HAVING COUNT(*) > 1) d`)
	noEffect := l.count(t, `SELECT COUNT(*) FROM idem_outbox o WHERE NOT EXISTS (SELECT 1 FROM effects e WHERE e.message_id = o.msg_id)`)
	stray := l.count(t, `SELECT COUNT(*) FROM effects e WHERE NOT EXISTS (SELECT 1 FROM idem_outbox o WHERE o.msg_id = e.message_id)`)
	f.Lost = max(missing, noEffect)
	if f.Doubled != 0 || noEffect != 0 || stray != 0 || f.Effects != f.Committed {
		t.Errorf("%d effect rows for %d events: %d events doubled, %d without an effect, %d rows of unknown events",
			f.Effects, f.Committed, f.Doubled, noEffect, stray)
	}
	if f.Settled.DeadLettered != 0 || f.Settled.Terminated != 0 {
		t.Errorf("%d deliveries dead-lettered, %d terminated", f.Settled.DeadLettered, f.Settled.Terminated)
	}
	return f
}

// Counts are the consumer's settled deliveries by what was done.
type Counts struct {
	Acked, Naked, DeadLettered, Terminated int
	Processed, Duplicate                   int // the inbox's outcomes among the acked
	Redelivered                            int // deliveries the broker counted or flagged as repeated
	StoreErrors                            int
}

func (c Counts) String() string {
	return fmt.Sprintf("%d acked (%d processed, %d duplicates), %d naked, %d redelivered, %d store errors retried, %d dead-lettered, %d terminated",
		c.Acked, c.Processed, c.Duplicate, c.Naked, c.Redelivered, c.StoreErrors, c.DeadLettered, c.Terminated)
}

// Tally counts settled deliveries and the message IDs delivered; safe
// for concurrent use.
type Tally struct {
	mu   sync.Mutex
	c    Counts
	seen map[string]int
}

// Add records one settled delivery of id.
func (y *Tally) Add(id string, action inbox.Action, res inbox.Result, redelivered bool, storeErrors int) {
	y.mu.Lock()
	defer y.mu.Unlock()
	if y.seen == nil {
		y.seen = map[string]int{}
	}
	switch action {
	case inbox.Acked:
		y.c.Acked++
		y.seen[id]++
	case inbox.Naked:
		y.c.Naked++
	case inbox.DeadLettered:
		y.c.DeadLettered++
	case inbox.Terminated:
		y.c.Terminated++
	}
	switch res {
	case inbox.Processed:
		y.c.Processed++
	case inbox.Duplicate:
		y.c.Duplicate++
	}
	if redelivered {
		y.c.Redelivered++
	}
	y.c.StoreErrors += storeErrors
}

// Counts returns the counts so far.
func (y *Tally) Counts() Counts {
	y.mu.Lock()
	defer y.mu.Unlock()
	return y.c
}

// Acked returns how many acked deliveries each message ID had.
func (y *Tally) Acked() map[string]int {
	y.mu.Lock()
	defer y.mu.Unlock()
	m := make(map[string]int, len(y.seen))
	for k, v := range y.seen {
		m[k] = v
	}
	return m
}

// RunUntilCleanup runs run in a goroutine until the test ends; an error
// other than the end of its context fails the test.
func RunUntilCleanup(t testing.TB, what string, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("%s: %v", what, err)
		}
	})
}

// Eventually polls cond every 50 ms until it holds, or fails t after
// timeout.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
