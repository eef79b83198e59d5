package inbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idemkit/idem/inbox"
)

// TestDeriveFromEmptyField: a message without an ID whose derivation
// fields are missing (empty) is Dead with ErrNoID and never handled;
// before, every such message got the ID of the same empty fields, so the
// first was handled and each different message after it was acked as its
// duplicate, its effect silently lost.
func TestDeriveFromEmptyField(t *testing.T) {
	t.Parallel()
	in, s := newInbox(t, inbox.Config{DeriveFrom: func(m inbox.Message) []string {
		return []string{m.Key, m.Topic, m.Headers["version"]}
	}})
	handled := map[string]int{}
	h := func(_ context.Context, d inbox.Delivery) error { handled[string(d.Payload)]++; return nil }
	for _, m := range []inbox.Message{
		{Topic: "order.paid", Payload: []byte("order-1")},
		{Topic: "order.paid", Payload: []byte("order-2")},
		{Topic: "order.paid", Key: "order-3", Payload: []byte("order-3")},
	} {
		o, err := in.Handle(t.Context(), m, h)
		if err != nil || o.Result != inbox.Dead || !errors.Is(o.Err, inbox.ErrNoID) {
			t.Errorf("Handle(%s without key or version) = %+v, %v; want Dead with ErrNoID", m.Payload, o, err)
		}
	}
	if len(handled) != 0 {
		t.Errorf("handled %v, want nothing handled", handled)
	}
	if _, err := s.Get(t.Context(), "g", inbox.DeriveID("", "order.paid", "")); !errors.Is(err, inbox.ErrNotFound) {
		t.Errorf("a record under the ID of empty fields: %v", err)
	}
}
