package rabbitmq_test

import (
	"context"
	"database/sql"
	"log"
	"os/signal"
	"syscall"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/rabbitmq"
)

// A loyalty consumer of the queue order.paid: each delivery runs in
// Inbox.HandleTx on the shop's database (db, with the inbox's store on
// it), and is acked only after the points and the consume record
// committed. A message that fails 5 times goes to the queue
// order.paid.dead, with the reason in its idem-dead-reason header.
// (Not run: it needs a broker.)
func ExampleConsumer() {
	var (
		db    *sql.DB                // the shop's database
		store inbox.TxStore          // sqlstore.NewInboxStore(db, …), migrated
		grant inbox.TxHandler        // writes the points in tx
		ctx   = context.Background() // the process's lifetime
	)
	in, err := inbox.New(store, &inbox.Config{Group: "loyalty", MaxAttempts: 5})
	if err != nil {
		log.Fatal(err)
	}
	c, err := rabbitmq.NewConsumer(&rabbitmq.ConsumerConfig{
		URL:   "amqp://shop:secret@mq.internal:5672/",
		Queue: "order.paid",
		Setup: func(ch *amqp.Channel) error { // on every (re)connection
			for _, q := range []string{"order.paid", "order.paid.dead"} {
				if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
					return err
				}
			}
			return nil
		},
		Workers:              4,
		DeadLetterRoutingKey: "order.paid.dead", // through the default exchange
	}, rabbitmq.HandleTx(in, db, grant))
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM)
	defer stop()
	if err := c.Run(ctx); err != nil { // reconnects until ctx ends
		log.Fatal(err)
	}
}

// The outbox's relay publishes to RabbitMQ under publisher confirms:
// each message's outbox ID is its message_id, so a re-publish after a
// relay crash is a duplicate to the consumer's inbox. (Not run: it needs
// a broker.)
func ExamplePublisher() {
	var (
		outboxStore outbox.Store // sqlstore.NewOutboxStore(db, …), migrated
		ctx         = context.Background()
	)
	p, err := rabbitmq.NewPublisher(&rabbitmq.PublisherConfig{
		URL:      "amqp://shop:secret@mq.internal:5672/",
		Exchange: "orders", // each message's Topic is its routing key
		Setup: func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare("orders", "topic", true, false, false, false, nil)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	relay, err := outbox.NewRelay(outboxStore, p, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
