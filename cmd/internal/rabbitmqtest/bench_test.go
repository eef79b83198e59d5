package rabbitmqtest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/benchpair"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/rabbitmq"
)

// BenchmarkPublish: a Relay pass of 100 messages (an in-memory outbox,
// so the figure is the Publisher's) next to 100 bare publishes with a
// publisher confirm each (PublishWithDeferredConfirm, then Wait), and one
// Publisher.Publish next to one bare confirmed publish, interleaved.
func BenchmarkPublish(b *testing.B) {
	br := newBroker(b, nil)
	conn, err := amqp.Dial(br.url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	bare := func(id string) {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", br.queue, true, false,
			amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, Body: make([]byte, 64),
				Headers: amqp.Table{"event": "order.paid", rabbitmq.HeaderKey: "k"}})
		if err != nil {
			b.Fatal(err)
		}
		if !dc.Wait() {
			b.Fatal("nacked")
		}
	}
	p := newPublisher(b, rabbitmq.PublisherConfig{URL: br.url})
	store := outbox.NewMemoryStore("ob-")
	r, err := outbox.NewRelay(store, p, &outbox.RelayConfig{BatchSize: 100, Retention: -1})
	if err != nil {
		b.Fatal(err)
	}
	msg := func(i int) outbox.Message {
		return outbox.Message{Topic: br.queue, Key: fmt.Sprint("k", i), Payload: make([]byte, 64),
			Headers: map[string]string{"event": "order.paid"}}
	}
	purge := func() {
		if _, err := br.ch.QueuePurge(br.queue, false); err != nil {
			b.Fatal(err)
		}
	}
	n := 0
	means := benchpair.Run(b,
		benchpair.Func{Name: "relay100", Before: func() {
			purge()
			for i := range 100 {
				if _, err := store.Add(ctx, msg(i)); err != nil {
					b.Fatal(err)
				}
			}
		}, F: func() {
			if sent, err := r.Once(ctx); err != nil || sent != 100 {
				b.Fatalf("relay sent %d: %v", sent, err)
			}
		}},
		benchpair.Func{Name: "bare100", Before: purge, F: func() {
			for range 100 {
				n++
				bare(fmt.Sprint("bare-", n))
			}
		}},
		benchpair.Func{Name: "publish", F: func() {
			n++
			m := msg(n)
			m.ID = fmt.Sprint("p-", n)
			if err := p.Publish(ctx, m); err != nil {
				b.Fatal(err)
			}
		}},
		benchpair.Func{Name: "bare", F: func() { n++; bare(fmt.Sprint("bare-", n)) }},
	)
	b.ReportMetric(100e9/means[0], "relay-msgs/s")
	b.ReportMetric(100e9/means[1], "bare-msgs/s")
	benchpair.Ratio(b, "x-bare", means[2], means[3])
}

// BenchmarkConsume: messages per second through a Consumer whose
// HandleFunc is Inbox.HandleTx, next to a Consumer whose HandleFunc runs
// the same handler in a bare transaction (no de-duplication), interleaved.
// Each iteration publishes 500 new messages (outside the timing) to each
// queue and times a consumer (4 workers, prefetch 64) from its start
// until it handled all 500.
func BenchmarkConsume(b *testing.B) {
	for _, dialect := range []string{"sqlite", "postgres"} {
		b.Run(dialect, func(b *testing.B) {
			var st *store
			if dialect == "sqlite" {
				st = sqliteStore(b)
			} else {
				st = postgresStore(b)
			}
			const batch = 500
			in := st.inbox(b, inbox.Config{})
			effect := st.effect("p")
			bareQ, dedupQ := newBroker(b, nil), newBroker(b, nil)
			var count atomic.Int64
			tx := func(ctx context.Context, m inbox.Message) (inbox.Outcome, error) {
				o, err := in.HandleTx(ctx, st.db, m, effect)
				if o.Result == inbox.Processed {
					count.Add(1)
				}
				return o, err
			}
			plain := func(ctx context.Context, m inbox.Message) (inbox.Outcome, error) {
				t, err := st.db.BeginTx(ctx, nil)
				if err != nil {
					return inbox.Outcome{Result: inbox.Retry}, err
				}
				if err := effect(ctx, t, inbox.Delivery{Message: m}); err != nil {
					_ = t.Rollback()
					return inbox.Outcome{Result: inbox.Retry}, err
				}
				if err := t.Commit(); err != nil {
					return inbox.Outcome{Result: inbox.Retry}, err
				}
				count.Add(1)
				return inbox.Outcome{Result: inbox.Processed}, nil
			}
			seq := 0
			fill := func(q *broker) func() {
				return func() {
					for range batch {
						seq++
						q.publish(b, fmt.Sprint("m-", seq), "x")
					}
					count.Store(0)
				}
			}
			consume := func(q *broker, h rabbitmq.HandleFunc) func() {
				return func() {
					cfg := q.consumerConfig()
					cfg.Workers, cfg.Prefetch = 4, 64
					c, err := rabbitmq.NewConsumer(&cfg, h)
					if err != nil {
						b.Fatal(err)
					}
					ctx, cancel := context.WithCancel(context.Background())
					done := make(chan struct{})
					go func() { defer close(done); _ = c.Run(ctx) }()
					deadline := time.Now().Add(time.Minute)
					for count.Load() < batch {
						if time.Now().After(deadline) {
							b.Fatalf("%d of %d handled", count.Load(), batch)
						}
						time.Sleep(100 * time.Microsecond)
					}
					cancel()
					<-done
				}
			}
			means := benchpair.Run(b,
				benchpair.Func{Name: "bare", Before: fill(bareQ), F: consume(bareQ, plain)},
				benchpair.Func{Name: "handletx", Before: fill(dedupQ), F: consume(dedupQ, tx)},
			)
			b.ReportMetric(batch*1e9/means[0], "bare-msgs/s")
			b.ReportMetric(batch*1e9/means[1], "handletx-msgs/s")
			benchpair.Ratio(b, "rate-ratio", means[0], means[1])
		})
	}
}
