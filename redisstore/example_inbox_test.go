package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/redisstore"
)

// Consume records on Redis, for effects outside a database (Inbox.Handle):
// the handler gets the message ID, the idempotency key of its downstream
// call, and the fence. The example needs a Redis server, so it is compiled
// but not run; TestInboxHandle runs the same steps against a real server.
func ExampleNewInboxStore() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	store, err := redisstore.NewInboxStore(client, &redisstore.InboxConfig{Prefix: "shop", Retention: 72 * time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	in, err := inbox.New(store, &inbox.Config{Group: "mailer"})
	if err != nil {
		log.Fatal(err)
	}
	o, err := in.Handle(ctx, inbox.Message{ID: "order-7.paid"}, func(ctx context.Context, d inbox.Delivery) error {
		// send the receipt with Idempotency-Key: d.ID
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(o.Result)
}
