package natsjstest

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/natsjs"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/sqlstore"
)

// BenchmarkPublish: messages published with the stream's confirmation
// (PubAck), one at a time: the bare client (js.PublishMsg with
// WithMsgID), the Publisher, and an outbox.Relay through the Publisher
// from a SQLite outbox (claim, publish, mark, in batches of 100).
func BenchmarkPublish(b *testing.B) {
	b.Run("bare", func(b *testing.B) {
		e := setup(b, 0)
		m := nats.NewMsg(e.subject + ".order.paid")
		m.Data = []byte(`{"amount_cents":1299}`)
		b.ResetTimer()
		for i := range b.N {
			if _, err := e.js.PublishMsg(context.Background(), m, jetstream.WithMsgID(fmt.Sprint("m-", i))); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("publisher", func(b *testing.B) {
		e := setup(b, 0)
		pub, err := natsjs.NewPublisher(e.js, &natsjs.PublisherConfig{Stream: e.stream})
		if err != nil {
			b.Fatal(err)
		}
		msg := outbox.Message{Topic: e.subject + ".order.paid", Key: "order-1", Payload: []byte(`{"amount_cents":1299}`)}
		b.ResetTimer()
		for i := range b.N {
			msg.ID = fmt.Sprint("m-", i)
			if err := pub.Publish(context.Background(), msg); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("relay", func(b *testing.B) {
		e := setup(b, 0)
		db, ob := outboxOn(b, b.TempDir()+"/outbox.db")
		for i := 0; i < b.N; i += 500 {
			tx, err := db.Begin()
			if err != nil {
				b.Fatal(err)
			}
			for j := i; j < min(i+500, b.N); j++ {
				if _, err := ob.Add(context.Background(), tx, outbox.Message{Topic: e.subject + ".order.paid", Key: fmt.Sprint("order-", j), Payload: []byte(`{"amount_cents":1299}`)}); err != nil {
					b.Fatal(err)
				}
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
		}
		pub, err := natsjs.NewPublisher(e.js, &natsjs.PublisherConfig{Stream: e.stream})
		if err != nil {
			b.Fatal(err)
		}
		relay, err := outbox.NewRelay(ob, pub, &outbox.RelayConfig{Retention: -1})
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for sent := 0; sent < b.N; {
			n, err := relay.Once(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			sent += n
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
}

// BenchmarkConsume: messages through the Consumer, from a stream that
// holds them all, each writing one effect row: with HandleTx (the effect
// and the consume record in one transaction) and with the same handler in
// a bare transaction, without de-duplication. SQLite (1 worker) and
// PostgreSQL (8 workers).
func BenchmarkConsume(b *testing.B) {
	for _, dbc := range []struct {
		name    string
		workers int
		open    func(b *testing.B) (*sql.DB, sqlstore.Dialect)
	}{
		{"sqlite", 1, func(b *testing.B) (*sql.DB, sqlstore.Dialect) {
			db, _, _ := sqliteInbox(b, inbox.Config{})
			return db, sqlstore.SQLite
		}},
		{"postgres", 8, func(b *testing.B) (*sql.DB, sqlstore.Dialect) {
			db, _ := testdb.Postgres(b)
			db.SetMaxOpenConns(8)
			db.SetMaxIdleConns(8)
			return db, sqlstore.PostgreSQL
		}},
	} {
		for _, mode := range []string{"bare", "handletx"} {
			b.Run(dbc.name+"/"+mode, func(b *testing.B) {
				e := setup(b, 0)
				db, d := dbc.open(b)
				_, in := inboxOn(b, db, d, inbox.Config{})
				h := effect(d, "p")
				p := natsjs.HandleTx(in, db, h)
				if mode == "bare" {
					p = func(ctx context.Context, m inbox.Message) (inbox.Outcome, error) {
						tx, err := db.BeginTx(ctx, nil)
						if err != nil {
							return inbox.Outcome{Result: inbox.Retry, Delay: time.Second}, err
						}
						if err := h(ctx, tx, inbox.Delivery{Message: m}); err != nil {
							_ = tx.Rollback()
							return inbox.Outcome{Result: inbox.Retry, Delay: time.Second}, err
						}
						if err := tx.Commit(); err != nil {
							return inbox.Outcome{Result: inbox.Retry, Delay: time.Second}, err
						}
						return inbox.Outcome{Result: inbox.Processed, ID: m.ID}, nil
					}
				}
				for i := range b.N {
					e.publish(b, "order.paid", fmt.Sprint("m-", i), `{"amount_cents":1299}`)
				}
				var done atomic.Int64
				all := make(chan struct{})
				c := newConsumer(b, e, p, natsjs.Config{Workers: dbc.workers, Prefetch: 128, Observe: func(ev natsjs.Event) {
					if ev.Action == natsjs.Acked && done.Add(1) == int64(b.N) {
						close(all)
					}
				}})
				b.ResetTimer()
				stop := run(b, c)
				<-all
				b.StopTimer()
				stop()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
				if n, _ := effects(b, db, d, ""); n != b.N {
					b.Fatalf("%d effects, want %d", n, b.N)
				}
			})
		}
	}
}
