package shop

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem/outbox"
)

// The default -events names exactly what shopd declared before the flag
// existed, and every name derives from -events.
func TestTopologyNames(t *testing.T) {
	for _, c := range []struct {
		name string
		want topology
	}{
		{DefaultEvents, topology{
			name: "shop", stream: "SHOP_ORDERS", deadStream: "SHOP_ORDERS_DEAD", subjects: "shop.order.>",
			deadSubjects: "idem.dead.SHOP_ORDERS.>", durable: "shop-loyalty",
			exchange: "shop.events", binding: "shop.order.*", queue: "shop-loyalty", deadQueue: "shop-loyalty.dead",
		}},
		{"shop-eu2", topology{
			name: "shop-eu2", stream: "SHOP_EU2_ORDERS", deadStream: "SHOP_EU2_ORDERS_DEAD", subjects: "shop-eu2.order.>",
			deadSubjects: "idem.dead.SHOP_EU2_ORDERS.>", durable: "shop-eu2-loyalty",
			exchange: "shop-eu2.events", binding: "shop-eu2.order.*", queue: "shop-eu2-loyalty", deadQueue: "shop-eu2-loyalty.dead",
		}},
	} {
		if err := checkEvents(c.name); err != nil {
			t.Fatal(err)
		}
		if got := newTopology(c.name); got != c.want {
			t.Errorf("newTopology(%q) = %+v, want %+v", c.name, got, c.want)
		}
	}
	for _, ok := range []string{"a", "shop", "s-1", strings.Repeat("s", 32)} {
		if err := checkEvents(ok); err != nil {
			t.Errorf("checkEvents(%q): %v", ok, err)
		}
	}
}

// The relay publishes a row's event in the namespace: the row holds the
// event's name; a row written before that (topic "shop.order.paid") goes
// to the namespace too. Other fields pass unchanged.
func TestNamedPublisherTopics(t *testing.T) {
	var got []outbox.Message
	rec := outbox.PublisherFunc(func(_ context.Context, m outbox.Message) error { got = append(got, m); return nil })
	p := namedPublisher{ns: "shop-eu", next: rec}
	for _, topic := range []string{"order.paid", "shop.order.refunded", "order.closed"} {
		if err := p.Publish(context.Background(), outbox.Message{ID: "shop-1", Topic: topic, Key: "ord_1", Payload: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	var topics []string
	for _, m := range got {
		topics = append(topics, m.Topic)
		if m.ID != "shop-1" || m.Key != "ord_1" || string(m.Payload) != "{}" {
			t.Errorf("published %+v, want the row's ID, key and payload", m)
		}
	}
	if want := []string{"shop-eu.order.paid", "shop-eu.order.refunded", "shop-eu.order.closed"}; !slices.Equal(topics, want) {
		t.Errorf("topics %v, want %v", topics, want)
	}
}
