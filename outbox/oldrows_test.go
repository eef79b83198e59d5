package outbox_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/outboxtest"
)

// TestRelayOldRowsWithReservedHeaders: a pending row written by an older
// build with a header that Add now refuses is published without it (the
// broker would act on it: refuse the message forever, roll up or purge
// its subject, route copies, or the publish would fail every time and
// hold its key back), with its other headers, and marked sent; the relay
// logs which headers it dropped. It does not get stuck on the row.
func TestRelayOldRowsWithReservedHeaders(t *testing.T) {
	t.Parallel()
	reserved := map[string]string{
		"Nats-Msg-Id": "forged", "Nats-Expected-Last-Sequence": "1", "nats-rollup": "sub", "Nats-TTL": "1s",
		"CC": "elsewhere", "bcc": "elsewhere", "x-death": "x", "X-First-Death-Reason": "x", "x-last-death-queue": "q",
		"x-delivery-count": "9", "amqp-redelivered": "true", "Idem-Key": "forged",
	}
	s := outbox.NewMemoryStore("ob-")
	var first string
	for i := range 2 {
		id, err := s.Add(t.Context(), outbox.Message{Topic: "orders", Key: "order-7", Headers: map[string]string{"event": "order.paid"}})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = id
		}
	}
	var logs bytes.Buffer
	rec := &outboxtest.Recorder{}
	r, err := outbox.NewRelay(outboxtest.WithHeaders(s, reserved), rec, &outbox.RelayConfig{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // one message of the key per claim
		if n, err := r.Once(t.Context()); n != 1 || err != nil {
			t.Fatalf("Once %d = %d, %v; want 1 message published", i, n, err)
		}
	}
	got := rec.Messages()
	if len(got) != 2 {
		t.Fatalf("%d messages published, want 2", len(got))
	}
	for _, m := range got {
		if m.Headers["event"] != "order.paid" || len(m.Headers) != 1 {
			t.Errorf("message %s published with headers %v, want only event=order.paid", m.ID, m.Headers)
		}
		if err := m.Validate(); err != nil {
			t.Errorf("message %s published as Add would refuse it: %v", m.ID, err)
		}
	}
	b, err := s.Claim(t.Context(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(b.Messages()); n != 0 {
		t.Fatalf("%d messages still pending after they were published", n)
	}
	_ = b.Release(t.Context())
	out := logs.String()
	if strings.Count(out, "reserved header") != 2 || !strings.Contains(out, "id="+first) || !strings.Contains(out, "Nats-Expected-Last-Sequence") {
		t.Fatalf("want one warning per message naming its ID and the dropped headers:\n%s", out)
	}
}
