package outbox_test

import (
	"context"
	"testing"

	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/outbox"
)

// TestRelayObserverNilStart: an Observer whose Start returns nil (taken
// for the context given) does not break a relay: its batch is published
// and marked sent.
func TestRelayObserverNilStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outbox.NewMemoryStore("m-")
	if _, err := s.Add(ctx, outbox.Message{Topic: "t", Key: "a"}); err != nil {
		t.Fatal(err)
	}
	obs := &obstest.NilStart{}
	published := 0
	p := outbox.PublisherFunc(func(ctx context.Context, m outbox.Message) error { published++; return ctx.Err() })
	r, err := outbox.NewRelay(s, p, &outbox.RelayConfig{Observer: obs, Name: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.Once(ctx); n != 1 || err != nil {
		t.Fatalf("Once = %d, %v; want 1", n, err)
	}
	if n, err := r.Once(ctx); n != 0 || err != nil {
		t.Fatalf("second Once = %d, %v; want 0 (the message was marked sent)", n, err)
	}
	if published != 1 || obs.Ends() == 0 {
		t.Fatalf("published %d, %d ends; want 1 and some", published, obs.Ends())
	}
}
