package rabbitmqtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/rabbitmq"
)

// The same message published 5 times with one message_id: one effect,
// five acks.
func TestConsumerSameMessageFiveTimes(t *testing.T) {
	t.Parallel()
	b := newBroker(t, nil)
	st := sqliteStore(t)
	in := st.inbox(t, inbox.Config{})
	for range 5 {
		b.publish(t, "order-1.paid", "1299")
	}
	var s seen
	run(t, b.consumerConfig(), s.wrap(rabbitmq.HandleTx(in, st.db, st.effect("p"))))
	eventually(t, 30*time.Second, "5 deliveries", func() bool { return len(s.all()) == 5 })
	if p, d := s.count(inbox.Processed), s.count(inbox.Duplicate); p != 1 || d != 4 {
		t.Fatalf("%d processed, %d duplicates; want 1 and 4: %+v", p, d, s.all())
	}
	if rows, _ := st.effects(t); rows != 1 {
		t.Fatalf("%d effect rows, want 1", rows)
	}
	eventually(t, 10*time.Second, "the queue to be empty", func() bool { n, _ := b.depth(t, b.queue); return n == 0 })
}

// A handler that fails twice and then succeeds: the effect once, on the
// third delivery; the later deliveries carry the redelivered flag, and on
// a quorum queue the delivery count.
func TestConsumerFailsTwice(t *testing.T) {
	t.Parallel()
	for _, qt := range []string{"classic", "quorum"} {
		t.Run(qt, func(t *testing.T) {
			t.Parallel()
			b := newBroker(t, amqp.Table{"x-queue-type": qt})
			st := sqliteStore(t)
			in := st.inbox(t, inbox.Config{Backoff: func(int) time.Duration { return 20 * time.Millisecond }})
			var calls atomic.Int64
			var counts []string
			h := func(ctx context.Context, tx *sql.Tx, d inbox.Delivery) error {
				if err := st.effect("p")(ctx, tx, d); err != nil {
					return err
				}
				counts = append(counts, d.Headers[rabbitmq.HeaderDeliveryCount]) // one worker
				if calls.Add(1) <= 2 {
					return errors.New("points service unavailable")
				}
				return nil
			}
			b.publish(t, "m", "x")
			var s seen
			run(t, b.consumerConfig(), s.wrap(rabbitmq.HandleTx(in, st.db, h)))
			eventually(t, 30*time.Second, "the third delivery", func() bool { return s.count(inbox.Processed) == 1 })
			got := s.all()
			want := []delivery{{"m", "false", inbox.Retry, 1}, {"m", "true", inbox.Retry, 2}, {"m", "true", inbox.Processed, 3}}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("deliveries %+v, want %+v", got, want)
			}
			if n := st.effectsOf(t, "m"); n != 1 {
				t.Fatalf("%d effects, want 1", n)
			}
			if qt == "quorum" && fmt.Sprint(counts) != "[ 1 2]" {
				t.Fatalf("x-delivery-count per delivery %q, want none, 1, 2", counts)
			}
			eventually(t, 10*time.Second, "the queue to be empty", func() bool { n, _ := b.depth(t, b.queue); return n == 0 })
		})
	}
}

// A poison message is dead after MaxAttempts and dead-lettered with the
// reason; a message without a message_id is dead-lettered at once; the
// other messages keep flowing.
func TestConsumerPoison(t *testing.T) {
	t.Parallel()
	b := newBroker(t, nil)
	st := sqliteStore(t)
	in := st.inbox(t, inbox.Config{MaxAttempts: 3, Backoff: func(int) time.Duration { return 10 * time.Millisecond }})
	h := func(ctx context.Context, tx *sql.Tx, d inbox.Delivery) error {
		if err := st.effect("p")(ctx, tx, d); err != nil {
			return err
		}
		if d.ID == "poison" {
			return errors.New("cannot decode payload")
		}
		return nil
	}
	b.publish(t, "poison", "{")
	b.publish(t, "", "no id")
	for i := range 10 {
		b.publish(t, fmt.Sprint("ok-", i), "x")
	}
	var s seen
	cfg := b.consumerConfig()
	cfg.Prefetch = 4
	run(t, cfg, s.wrap(rabbitmq.HandleTx(in, st.db, h)))
	eventually(t, 30*time.Second, "two dead-lettered messages", func() bool { n, _ := b.depth(t, b.dlq); return n == 2 })
	eventually(t, 30*time.Second, "ten effects", func() bool { rows, _ := st.effects(t); return rows == 10 })
	dead := b.drain(t, b.dlq)
	reasons := map[string]string{}
	for _, d := range dead {
		reasons[d.MessageId] = fmt.Sprint(d.Headers[rabbitmq.HeaderDeadReason])
		if d.Headers[rabbitmq.HeaderDeadQueue] != b.queue {
			t.Errorf("dead message %q: queue header %v", d.MessageId, d.Headers[rabbitmq.HeaderDeadQueue])
		}
	}
	if reasons["poison"] != "cannot decode payload" || reasons[""] != inbox.ErrNoID.Error() {
		t.Fatalf("dead-lettered %v", reasons)
	}
	if n := st.effectsOf(t, "poison"); n != 0 {
		t.Fatalf("%d effects of the poison message", n)
	}
	r, err := st.s.Get(t.Context(), "loyalty", "poison")
	if err != nil || r.Status != inbox.StatusDead || r.Attempts != 3 {
		t.Fatalf("poison record %+v %v, want dead after 3", r, err)
	}
	if _, d := st.effects(t); d != 10 {
		t.Fatalf("%d distinct effects, want 10", d)
	}
	eventually(t, 10*time.Second, "the queue to be empty", func() bool { n, _ := b.depth(t, b.queue); return n == 0 })
}

// Without a dead-letter exchange, a dead message is rejected without
// requeue: the queue's x-dead-letter-exchange receives it.
func TestConsumerDeadRejected(t *testing.T) {
	t.Parallel()
	b := newBroker(t, nil)
	q := b.queue + ".dlx"
	if _, err := b.ch.QueueDeclare(q, false, false, false, false, amqp.Table{
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": b.dlq,
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = b.ch.QueueDelete(q, false, false, false) })
	st := sqliteStore(t)
	in := st.inbox(t, inbox.Config{})
	if err := b.ch.PublishWithContext(t.Context(), "", q, true, false, amqp.Publishing{Body: []byte("no id")}); err != nil {
		t.Fatal(err)
	}
	cfg := b.consumerConfig()
	cfg.Queue, cfg.DeadLetterRoutingKey = q, ""
	run(t, cfg, rabbitmq.HandleTx(in, st.db, st.effect("p")))
	eventually(t, 30*time.Second, "the rejected message in the dead-letter queue", func() bool { n, _ := b.depth(t, b.dlq); return n == 1 })
	d := b.drain(t, b.dlq)[0]
	if _, ok := d.Headers["x-death"]; !ok || string(d.Body) != "no id" {
		t.Fatalf("dead-lettered %+v", d)
	}
}

// The connection drops (a proxy between the consumer and RabbitMQ cuts
// it) while messages flow: the consumer reconnects and consumption
// resumes; every message has its effect once.
func TestConsumerReconnects(t *testing.T) {
	t.Parallel()
	b := newBroker(t, nil)
	st := sqliteStore(t)
	in := st.inbox(t, inbox.Config{})
	proxy := proxyFor(t, b.url)
	cfg := b.consumerConfig()
	cfg.URL = proxy.url
	var logs obstest.LogBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	var s seen
	run(t, cfg, s.wrap(rabbitmq.HandleTx(in, st.db, st.effect("p"))))
	for i := range 20 {
		b.publish(t, fmt.Sprint("a-", i), "x")
	}
	eventually(t, 30*time.Second, "the first 20 effects", func() bool { rows, _ := st.effects(t); return rows == 20 })
	for drop := range 3 {
		proxy.Drop()
		eventually(t, 10*time.Second, "the drop to be noticed", func() bool {
			return strings.Count(logs.String(), "consumer session ended") >= drop+1
		})
		for i := range 20 {
			b.publish(t, fmt.Sprint("b-", i), "x") // b-* again each time: duplicates
		}
		eventually(t, 10*time.Second, "the consumer to be back", func() bool {
			return strings.Count(logs.String(), "rabbitmq: consuming") >= drop+2
		})
		time.Sleep(20 * time.Millisecond) // let some flow before the next drop
	}
	// b-* were published 3 times: 40 processed, at least 40 duplicates
	// (more if a drop cut an ack).
	eventually(t, 30*time.Second, "every delivery after the drops", func() bool {
		return s.count(inbox.Processed) == 40 && s.count(inbox.Duplicate) >= 40
	})
	eventually(t, 30*time.Second, "the queue to be empty", func() bool { n, c := b.depth(t, b.queue); return n == 0 && c == 1 })
	if rows, distinct := st.effects(t); rows != 40 || distinct != 40 {
		t.Fatalf("%d effects, %d distinct; want 40", rows, distinct)
	}
}

type proxy struct {
	*netfault.Proxy
	url string
}

// proxyFor starts a netfault proxy to the broker at url.
func proxyFor(t testing.TB, url string) proxy {
	t.Helper()
	u, err := amqp.ParseURI(url)
	if err != nil {
		t.Fatal(err)
	}
	p, err := netfault.New(fmt.Sprintf("%s:%d", u.Host, u.Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	host, port, _ := splitHostPort(p.Addr())
	u.Host, u.Port = host, port
	return proxy{p, u.String()}
}

func splitHostPort(addr string) (string, int, error) {
	var host string
	var port int
	i := len(addr) - 1
	for i >= 0 && addr[i] != ':' {
		i--
	}
	host = addr[:i]
	_, err := fmt.Sscan(addr[i+1:], &port)
	return host, port, err
}
