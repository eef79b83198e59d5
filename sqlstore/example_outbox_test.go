package sqlstore_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

// The outbox on SQLite (PostgreSQL and MySQL alike): the event is written
// in the business transaction, and a relay publishes it with the row's id
// as its message id.
func ExampleOutboxStore_Add() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-outbox-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(ctx, filepath.Join(dir, "shop.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (no TEXT PRIMARY KEY, status TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	events, err := sqlstore.NewOutboxStore(db, &sqlstore.OutboxConfig{Dialect: sqlstore.SQLite, IDPrefix: "shop-"})
	if err != nil {
		log.Fatal(err)
	}
	defer events.Close()
	if err := events.Migrate(ctx); err != nil { // creates idem_outbox
		log.Fatal(err)
	}

	// The state change and its event commit together, or neither does.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (no, status) VALUES ('order-1', 'paid')`); err != nil {
		log.Fatal(err)
	}
	if _, err := events.Add(ctx, tx, outbox.Message{
		Topic:   "order.paid",
		Key:     "order-1", // one order's events are published in order
		Payload: []byte(`{"order_no":"order-1","amount_cents":1299}`),
	}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	// The relay: a broker adapter is the Publisher; Run loops, Once is one pass.
	publish := outbox.PublisherFunc(func(ctx context.Context, m outbox.Message) error {
		// The ID: the prefix, then 26 characters of time and randomness
		// made at Add (outbox.NewID), kept in the row for every publish.
		fmt.Println("publish", m.Topic, "message id", m.ID[:len("shop-")]+"…", len(m.ID), "bytes")
		return nil // confirmed by the broker: marked sent
	})
	relay, err := outbox.NewRelay(events, publish, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.Once(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: publish order.paid message id shop-… 31 bytes
}
