package inbox_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idem/inbox"
)

// A message delivered three times has one effect; the adapter acks every
// delivery.
func ExampleInbox_Handle() {
	in, err := inbox.New(inbox.NewMemoryStore(), &inbox.Config{Group: "mailer"})
	if err != nil {
		panic(err)
	}
	sent := 0
	send := func(ctx context.Context, d inbox.Delivery) error {
		// d.ID is the idempotency key of the downstream call.
		sent++
		return nil
	}
	for range 3 {
		o, err := in.Handle(context.Background(), inbox.Message{ID: "order-7.paid"}, send)
		if err != nil {
			panic(err)
		}
		fmt.Println(o.Result, "ack:", o.Result.Ack())
	}
	fmt.Println("sent:", sent)
	// Output:
	// processed ack: true
	// duplicate ack: true
	// duplicate ack: true
	// sent: 1
}

// A failing handler releases the message for redelivery; after
// MaxAttempts failures it is dead.
func ExampleOutcome() {
	in, _ := inbox.New(inbox.NewMemoryStore(), &inbox.Config{Group: "g", MaxAttempts: 2})
	fail := func(context.Context, inbox.Delivery) error { return errors.New("downstream 503") }
	for range 3 {
		o, _ := in.Handle(context.Background(), inbox.Message{ID: "m"}, fail)
		fmt.Println(o.Result, o.Attempt, o.Err)
	}
	// Output:
	// retry 1 downstream 503
	// dead 2 downstream 503
	// dead 2 <nil>
}

func ExampleDeriveID() {
	fmt.Println(inbox.DeriveID("order-7", "order.paid", "1")[:15])
	// Output: sha256:73bef9f8
}
