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
