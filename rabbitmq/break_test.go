package rabbitmq_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/outboxtest"
	"github.com/idemkit/idem/rabbitmq"
)

// Every message the outbox accepts can be published: a header name
// longer than an AMQP table's field names (255 bytes) fails every
// publish, a poison message holding its key back forever; it must be
// refused at Add. The longest name AMQP carries is published.
func TestPublisherLongHeaderName(t *testing.T) {
	t.Parallel()
	b := newBroker(t, nil)
	p := newPublisher(t, rabbitmq.PublisherConfig{URL: b.url})
	for i, name := range []string{strings.Repeat("h", 255), strings.Repeat("h", 256)} {
		m := outbox.Message{ID: fmt.Sprint("h-", i), Topic: b.queue, Headers: map[string]string{name: "v"}}
		if err := m.Validate(); err != nil {
			if !errors.Is(err, outbox.ErrInvalid) {
				t.Errorf("header of %d bytes: Validate = %v, want ErrInvalid", len(name), err)
			}
			continue // refused at Add
		}
		if err := p.Publish(t.Context(), m); err != nil {
			t.Errorf("header of %d bytes: accepted by the outbox, and Publish = %v", len(name), err)
		}
	}
}

// A CC or BCC header is RabbitMQ's sender-selected distribution: the
// broker routes copies by it, and closes the channel when its value is a
// string, as every header of an outbox message is. Accepted by the
// outbox, it would fail every publish; it must be refused at Add.
func TestPublisherRoutingHeaders(t *testing.T) {
	t.Parallel()
	b := newBroker(t, nil)
	p := newPublisher(t, rabbitmq.PublisherConfig{URL: b.url})
	for i, name := range []string{"CC", "BCC"} {
		m := outbox.Message{ID: fmt.Sprint("cc-", i), Topic: b.queue, Headers: map[string]string{name: b.dlq}}
		if err := m.Validate(); err != nil {
			if !errors.Is(err, outbox.ErrInvalid) {
				t.Errorf("header %s: Validate = %v, want ErrInvalid", name, err)
			}
			continue // refused at Add
		}
		if err := p.Publish(t.Context(), m); err != nil {
			t.Errorf("header %s: accepted by the outbox, and Publish = %v", name, err)
		}
	}
}

// A pending row that an older build added with a CC header (before Add
// refused it) does not hold its key back forever: RabbitMQ would close
// the channel on every publish of it. The relay publishes it without the
// header, once, to its own queue only, and the next message of its key
// after it.
func TestRelayOldRowWithCC(t *testing.T) {
	t.Parallel()
	b := newBroker(t, nil)
	p := newPublisher(t, rabbitmq.PublisherConfig{URL: b.url})
	s := outbox.NewMemoryStore("ob-")
	var ids []string
	for range 2 {
		id, err := s.Add(t.Context(), outbox.Message{Topic: b.queue, Key: "order-7", Headers: map[string]string{"event": "order.paid"}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	r, err := outbox.NewRelay(outboxtest.WithHeaders(s, map[string]string{"CC": b.dlq}), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if n, err := r.Once(t.Context()); n != 1 || err != nil {
			t.Fatalf("Once %d = %d, %v; want the key's head published", i, n, err)
		}
	}
	got := b.drain(t, b.queue)
	if len(got) != 2 || got[0].MessageId != ids[0] || got[1].MessageId != ids[1] {
		t.Fatalf("%d messages in the queue, want %s and %s", len(got), ids[0], ids[1])
	}
	for _, d := range got {
		if _, ok := d.Headers["CC"]; ok || d.Headers["event"] != "order.paid" {
			t.Fatalf("%s delivered with headers %v", d.MessageId, d.Headers)
		}
	}
	if n := len(b.drain(t, b.dlq)); n != 0 {
		t.Fatalf("%d copies routed by the old row's CC header", n)
	}
}
