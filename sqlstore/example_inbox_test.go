package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

// A loyalty consumer grants points for order.paid with Inbox.HandleTx:
// the points and the consume record commit in one transaction, so a
// redelivered message (a lost ack, a broker failover) is a duplicate and
// a failed one is retried. The README shows the handler and the loop.
func ExampleInboxStore() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "inbox-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(ctx, filepath.Join(dir, "shop.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := sqlstore.NewInboxStore(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil { // creates idem_inbox
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE points (user TEXT, points INTEGER)`); err != nil {
		log.Fatal(err)
	}

	in, err := inbox.New(store, &inbox.Config{Group: "loyalty", MaxAttempts: 5})
	if err != nil {
		log.Fatal(err)
	}
	// grant runs in the transaction that also records the message.
	grant := func(ctx context.Context, tx *sql.Tx, d inbox.Delivery) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO points (user, points) VALUES (?, ?)`, d.Key, 120)
		return err
	}
	msg := inbox.Message{ID: "order-7.paid", Topic: "order.paid", Key: "ada"}
	for range 3 { // delivered three times
		o, err := in.HandleTx(ctx, db, msg, grant)
		if err != nil {
			log.Fatal(err) // the store failed: nak, the message comes back
		}
		switch o.Result {
		case inbox.Processed, inbox.Duplicate:
			fmt.Println(o.Result, "→ ack")
		case inbox.Retry, inbox.InProgress:
			fmt.Println(o.Result, "→ nak, redeliver after", o.Delay)
		case inbox.Dead:
			fmt.Println(o.Result, "→ dead-letter:", o.Err)
		}
	}

	var total int
	if err := db.QueryRowContext(ctx, `SELECT SUM(points) FROM points WHERE user = 'ada'`).Scan(&total); err != nil {
		log.Fatal(err)
	}
	fmt.Println("points:", total)
	_, err = store.Get(ctx, "loyalty", "order-8.paid")
	fmt.Println(errors.Is(err, inbox.ErrNotFound))
	// Output:
	// processed → ack
	// duplicate → ack
	// duplicate → ack
	// points: 120
	// true
}
