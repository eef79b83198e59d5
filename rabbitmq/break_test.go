package rabbitmq_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/idemkit/idem/outbox"
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
