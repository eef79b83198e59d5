package outbox_test

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/outbox"
)

// A relay moves the outbox's messages to a publisher, each key's in
// order. Here the store is in memory and the publisher prints. A
// message's ID is the store's prefix and 26 characters made at Add
// (outbox.NewID): published again, it carries the same ID.
func ExampleRelay_Once() {
	ctx := context.Background()
	store := outbox.NewMemoryStore("shop-")
	for _, ev := range []string{"order.paid", "order.refunded"} {
		if _, err := store.Add(ctx, outbox.Message{Topic: ev, Key: "order-1", Payload: []byte(`{"order_no":"order-1"}`)}); err != nil {
			panic(err)
		}
	}
	print := outbox.PublisherFunc(func(ctx context.Context, m outbox.Message) error {
		fmt.Println("publish", m.ID[:len("shop-")]+"…", m.Topic, m.Key)
		return nil // confirmed: the relay marks it sent
	})
	relay, err := outbox.NewRelay(store, print, nil)
	if err != nil {
		panic(err)
	}
	for {
		n, err := relay.Once(ctx)
		if err != nil {
			panic(err)
		}
		if n == 0 {
			break
		}
	}
	// Output:
	// publish shop-… order.paid order-1
	// publish shop-… order.refunded order-1
}

// A message added in a transaction that rolls back is never published.
func ExampleMemoryStore_Begin() {
	ctx := context.Background()
	store := outbox.NewMemoryStore("")
	tx := store.Begin()
	if _, err := tx.Add(ctx, outbox.Message{Topic: "order.paid", Key: "order-7"}); err != nil {
		panic(err)
	}
	tx.Rollback()
	b, err := store.Claim(ctx, 10)
	if err != nil {
		panic(err)
	}
	fmt.Println(len(b.Messages()), "pending")
	_ = b.Release(ctx)
	// Output: 0 pending
}

// A store makes a message's ID with NewID when the message is added: a
// readable prefix, then 26 characters (the time in milliseconds and 80
// random bits), unique across stores and databases.
func ExampleNewID() {
	id := outbox.NewID("shop-eu/")
	fmt.Println(id[:len("shop-eu/")], len(id)-len("shop-eu/") == outbox.IDLen, id != outbox.NewID("shop-eu/"))
	// Output: shop-eu/ true true
}
