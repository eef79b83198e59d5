package inbox_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem/inbox"
)

// printed is a BrokerDelivery that prints what the loop does with it: an
// adapter's would ack, nak and dead-letter on its broker.
type printed struct{ m inbox.Message }

func (p printed) Message() inbox.Message           { return p.m }
func (p printed) FallbackID() string               { return "" }
func (p printed) Delivered() int                   { return 1 }
func (p printed) Ack(context.Context) error        { fmt.Println("ack"); return nil }
func (p printed) InProgress(context.Context) error { return nil }
func (p printed) Nak(_ context.Context, d time.Duration) error {
	fmt.Println("nak after", d)
	return nil
}
func (p printed) Term(context.Context, string) error { fmt.Println("term"); return nil }
func (p printed) DeadLetter(_ context.Context, reason string, _ inbox.Outcome) error {
	fmt.Println("dead-letter:", reason)
	return nil
}

// A broker adapter hands each delivery to Consumer.Settle, which runs
// the inbox and settles it: here an order event without an ID, whose ID
// is derived from its order number, event type and version, so that the
// producer's second publish is a duplicate.
func ExampleConsumer() {
	in, _ := inbox.New(inbox.NewMemoryStore(), &inbox.Config{Group: "loyalty"})
	c, _ := inbox.NewConsumer(&inbox.ConsumerConfig{
		Process: in.Process(func(ctx context.Context, d inbox.Delivery) error {
			fmt.Println("grant points for order", d.Headers["Order-No"])
			return nil
		}),
		DeriveFrom: func(m inbox.Message) []string {
			return []string{m.Headers["Order-No"], m.Headers["Event-Type"], m.Headers["Event-Version"]}
		},
	})
	ev := inbox.Message{Headers: map[string]string{"Order-No": "7", "Event-Type": "order.paid", "Event-Version": "1"}}
	for range 2 {
		s := c.Settle(context.Background(), printed{ev})
		fmt.Println(s.Outcome.Result)
	}
	// Output:
	// grant points for order 7
	// ack
	// processed
	// ack
	// duplicate
}
