package rabbitmq_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/rabbitmq"
)

func newPublisher(t testing.TB, cfg rabbitmq.PublisherConfig) *rabbitmq.Publisher {
	t.Helper()
	p, err := rabbitmq.NewPublisher(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// Publish sends the outbox message's ID as message_id, its headers and
// key, persistent, and returns after the broker's confirm.
func TestPublisherMessage(t *testing.T) {
	t.Parallel()
	b := newBroker(t, nil)
	p := newPublisher(t, rabbitmq.PublisherConfig{URL: b.url})
	msg := outbox.Message{ID: "ob-1", Topic: b.queue, Key: "order-7", Payload: []byte(`{"amount_cents":1299}`),
		Headers: map[string]string{"event": "order.paid"}}
	if err := p.Publish(t.Context(), msg); err != nil {
		t.Fatal(err)
	}
	// The confirm came back: the message is in the queue now.
	got := b.drain(t, b.queue)
	if len(got) != 1 {
		t.Fatalf("%d messages in the queue, want 1", len(got))
	}
	d := got[0]
	if d.MessageId != "ob-1" || d.DeliveryMode != amqp.Persistent || string(d.Body) != string(msg.Payload) ||
		d.Headers["event"] != "order.paid" || d.Headers[rabbitmq.HeaderKey] != "order-7" || d.RoutingKey != b.queue {
		t.Fatalf("delivered %+v", d)
	}
}

// A broker nack (a full queue that rejects publishes) and a return (no
// queue bound) are errors; AllowUnroutable confirms the unroutable
// message.
func TestPublisherRefused(t *testing.T) {
	t.Parallel()
	b := newBroker(t, nil)
	full := b.queue + ".full"
	if _, err := b.ch.QueueDeclare(full, false, false, false, false, amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	ex := b.queue + ".nowhere"
	if err := b.ch.ExchangeDeclare(ex, "direct", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = b.ch.QueueDelete(full, false, false, false)
		_ = b.ch.ExchangeDelete(ex, false, false)
	})
	p := newPublisher(t, rabbitmq.PublisherConfig{URL: b.url})
	if err := p.Publish(t.Context(), outbox.Message{ID: "1", Topic: full}); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(t.Context(), outbox.Message{ID: "2", Topic: full}); !errors.Is(err, rabbitmq.ErrNacked) {
		t.Fatalf("publish to a full queue = %v, want ErrNacked", err)
	}
	if err := p.Publish(t.Context(), outbox.Message{ID: "3", Topic: b.queue}); err != nil {
		t.Fatalf("the channel is usable after a nack: %v", err)
	}

	pe := newPublisher(t, rabbitmq.PublisherConfig{URL: b.url, Exchange: ex})
	var ue *rabbitmq.UnroutableError
	if err := pe.Publish(t.Context(), outbox.Message{ID: "4", Topic: "k"}); !errors.As(err, &ue) || ue.Exchange != ex {
		t.Fatalf("publish to an exchange without bindings = %v, want an UnroutableError", err)
	}
	if err := b.ch.QueueBind(b.queue, "k", ex, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := pe.Publish(t.Context(), outbox.Message{ID: "5", Topic: "k"}); err != nil {
		t.Fatalf("publish once bound = %v", err)
	}
	pa := newPublisher(t, rabbitmq.PublisherConfig{URL: b.url, Exchange: ex, AllowUnroutable: true})
	if err := pa.Publish(t.Context(), outbox.Message{ID: "6", Topic: "unbound"}); err != nil {
		t.Fatalf("AllowUnroutable: %v", err)
	}
	var ids []string
	for _, d := range b.drain(t, b.queue) {
		ids = append(ids, d.MessageId)
	}
	if fmt.Sprint(ids) != "[3 5]" {
		t.Fatalf("queue holds %v, want [3 5]", ids)
	}
}

// The publisher's connection drops (a proxy cuts it): the publish in
// flight or the next one fails, and a later one reconnects and is
// confirmed.
func TestPublisherReconnects(t *testing.T) {
	t.Parallel()
	b := newBroker(t, nil)
	proxy := proxyFor(t, b.url)
	p := newPublisher(t, rabbitmq.PublisherConfig{URL: proxy.url})
	for round := range 3 {
		if err := p.Publish(t.Context(), outbox.Message{ID: fmt.Sprint("before-", round), Topic: b.queue}); err != nil {
			t.Fatal(err)
		}
		proxy.Drop()
		failed := 0
		eventually(t, 10*time.Second, "a confirmed publish after the drop", func() bool {
			err := p.Publish(t.Context(), outbox.Message{ID: fmt.Sprint("after-", round), Topic: b.queue})
			if err != nil {
				failed++
			}
			return err == nil
		})
		t.Logf("round %d: %d publishes failed before the reconnection", round, failed)
	}
	ids := map[string]bool{}
	for _, d := range b.drain(t, b.queue) {
		ids[d.MessageId] = true
	}
	for round := range 3 {
		if !ids[fmt.Sprint("before-", round)] || !ids[fmt.Sprint("after-", round)] {
			t.Fatalf("queue holds %v", ids)
		}
	}
}
