package natsjs_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/idemkit/idem/natsjs"
	"github.com/idemkit/idem/outbox"
)

// Every message the outbox accepts (outbox.Message.Validate, which every
// store's Add runs) can be published: a header name that the NATS client
// refuses (a space, a slash, a colon, a control character, a non-ASCII
// letter) would fail the publish every time, a poison message holding
// its key back forever. Such a name must be refused at Add, in the
// business transaction.
func TestPublisherHeaderNames(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	p, err := natsjs.NewPublisher(e.js, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Headers the server acts on would fail it too (a stream that is not
	// "v", a last sequence that is not "v"): they are refused at Add.
	for i, name := range []string{"Content Type", "user/id", "a:b", "h\x01", "\u00e9", "x\ty", "(x)", "Trace-Id", "x.y_z-1",
		"Nats-Expected-Stream", "Nats-Expected-Last-Sequence", "Nats-Expected-Last-Msg-Id"} {
		m := outbox.Message{ID: fmt.Sprint("h-", i), Topic: e.subject + ".h", Headers: map[string]string{name: "v"}}
		if err := m.Validate(); err != nil {
			if !errors.Is(err, outbox.ErrInvalid) {
				t.Errorf("header %q: Validate = %v, want ErrInvalid", name, err)
			}
			continue // refused at Add
		}
		if err := p.Publish(t.Context(), m); err != nil {
			t.Errorf("header %q: accepted by the outbox, and Publish = %v", name, err)
		}
	}
}
