package natsjs_test

import (
	"context"
	"database/sql"
	"log"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/natsjs"
	"github.com/idemkit/idem/outbox"
)

// A loyalty consumer: order.paid events from the ORDERS stream grant
// points with Inbox.HandleTx, so the points and the consume record commit
// together; a redelivery is acked as a duplicate, a failure naked with
// the inbox's backoff, a poison message dead-lettered to
// "idem.dead.ORDERS.loyalty" (which the ORDERS_DEAD stream keeps). The
// example needs a NATS server and a database, so it is compiled but not
// run; the tests in cmd/internal/natsjstest run the same steps against
// real servers.
func ExampleConsumer() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	var db *sql.DB          // the shop's database (PostgreSQL here)
	var store inbox.TxStore // sqlstore.NewInboxStore(db, &sqlstore.Config{Dialect: sqlstore.PostgreSQL}), migrated
	in, err := inbox.New(store, &inbox.Config{Group: "loyalty", MaxAttempts: 5})
	if err != nil {
		log.Fatal(err)
	}

	// Reconnect for as long as it takes: a connection whose attempts ran
	// out is closed for good, and Run returns.
	nc, err := nats.Connect("nats://127.0.0.1:4222", nats.MaxReconnects(-1))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "ORDERS_DEAD", Subjects: []string{"idem.dead.ORDERS.>"}}); err != nil {
		log.Fatal(err)
	}

	grant := func(ctx context.Context, tx *sql.Tx, d inbox.Delivery) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO points (order_no, points) VALUES ($1, 120)`, d.Key)
		return err
	}
	c, err := natsjs.NewConsumer(ctx, js, natsjs.HandleTx(in, db, grant), &natsjs.Config{
		Stream:         "ORDERS",
		Durable:        "loyalty",
		FilterSubjects: []string{"orders.paid"},
		Workers:        4,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil { // until SIGTERM
		log.Fatal(err)
	}
}

// The outbox relay publishes through a Publisher: the outbox row's ID is
// the message's Nats-Msg-Id, so a message republished after a relay died
// between the PubAck and its mark is dropped by the stream's Duplicates
// window, or by the consumer's inbox after it. (Not run: it needs a NATS
// server and a database.)
func ExamplePublisher() {
	ctx := context.Background()
	var js jetstream.JetStream // as in ExampleConsumer
	var store outbox.Store     // the shop's outbox: sqlstore.NewOutboxStore(db, …), migrated
	pub, err := natsjs.NewPublisher(js, &natsjs.PublisherConfig{Stream: "ORDERS"})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(store, pub, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
