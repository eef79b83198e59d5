package outbox_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/outboxtest"
)

func memHarness(t *testing.T) outboxtest.Harness {
	s := outbox.NewMemoryStore("mem-")
	return outboxtest.Harness{
		Store: s,
		Add: func(ctx context.Context, msgs ...outbox.Message) ([]string, error) {
			tx := s.Begin()
			var ids []string
			for _, m := range msgs {
				id, err := tx.Add(ctx, m)
				if err != nil {
					tx.Rollback()
					return nil, err
				}
				ids = append(ids, id)
			}
			tx.Commit()
			return ids, nil
		},
		AddRollback: func(ctx context.Context, msgs ...outbox.Message) error {
			tx := s.Begin()
			defer tx.Rollback()
			for _, m := range msgs {
				if _, err := tx.Add(ctx, m); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

func TestMemoryConformance(t *testing.T) {
	t.Parallel()
	outboxtest.Run(t, memHarness, outboxtest.Caps{})
}

func TestValidate(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", outbox.MaxKeyLen+1)
	for _, c := range []struct {
		name string
		m    outbox.Message
		ok   bool
	}{
		{"minimal", outbox.Message{Topic: "t"}, true},
		{"full", outbox.Message{Topic: "t", Key: "k", Payload: []byte("p"), Headers: map[string]string{"h": ""}}, true},
		{"no topic", outbox.Message{Key: "k"}, false},
		{"long key", outbox.Message{Topic: "t", Key: long}, false},
		{"bad key", outbox.Message{Topic: "t", Key: "\xc3"}, false},
		{"empty header", outbox.Message{Topic: "t", Headers: map[string]string{"": "v"}}, false},
		{"header name with a space", outbox.Message{Topic: "t", Headers: map[string]string{"Content Type": "v"}}, false},
		{"header name with a colon", outbox.Message{Topic: "t", Headers: map[string]string{"a:b": "v"}}, false},
		{"header name with a slash", outbox.Message{Topic: "t", Headers: map[string]string{"user/id": "v"}}, false},
		{"header name not ASCII", outbox.Message{Topic: "t", Headers: map[string]string{"\u00e9": "v"}}, false},
		{"header name with a control character", outbox.Message{Topic: "t", Headers: map[string]string{"h\x7f": "v"}}, false},
		{"header name too long", outbox.Message{Topic: "t", Headers: map[string]string{strings.Repeat("h", outbox.MaxHeaderNameLen+1): "v"}}, false},
		{"longest header name", outbox.Message{Topic: "t", Headers: map[string]string{strings.Repeat("h", outbox.MaxHeaderNameLen): "v"}}, true},
		{"header name of token characters", outbox.Message{Topic: "t", Headers: map[string]string{"X-Trace_id.1!#$%&'*+^`|~": "v"}}, true},
		// What idem itself adds: the trace (idemotel.Inject), the shop's
		// retried events.
		{"trace context", outbox.Message{Topic: "t", Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "a=b", "baggage": "k=v"}}, true},
		{"Idem-Retry-Of", outbox.Message{Topic: "t", Headers: map[string]string{"Idem-Retry-Of": "shop-7"}}, true},
		{"a name holding Nats- not first", outbox.Message{Topic: "t", Headers: map[string]string{"X-Nats-Msg-Id": "v", "Natsy": "v", "x-cc": "v", "Bcc-List": "v"}}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			err := c.m.Validate()
			if c.ok != (err == nil) || (err != nil && !errors.Is(err, outbox.ErrInvalid)) {
				t.Fatalf("Validate = %v, want ok %v", err, c.ok)
			}
		})
	}
}

// Headers a broker or a publisher interprets are refused, whatever their
// case: the error names the header and says why.
func TestValidateReservedHeaders(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, why string }{
		{"Nats-Msg-Id", "message's ID"},
		{"nats-msg-id", "message's ID"},
		{"Nats-Expected-Stream", "NATS JetStream"},
		{"Nats-Expected-Last-Msg-Id", "NATS JetStream"},
		{"Nats-Expected-Last-Sequence", "NATS JetStream"},
		{"Nats-Expected-Last-Subject-Sequence", "NATS JetStream"},
		{"Nats-Rollup", "NATS JetStream"},
		{"NATS-TTL", "NATS JetStream"},
		{"Nats-Anything-Later", "NATS JetStream"},
		{"CC", "RabbitMQ"},
		{"bcc", "RabbitMQ"},
		{"x-death", "RabbitMQ"},
		{"x-first-death-reason", "RabbitMQ"},
		{"X-Last-Death-Queue", "RabbitMQ"},
		{"x-delivery-count", "RabbitMQ"},
		{"amqp-redelivered", "consumer"},
		{"Idem-Key", "Key"},
		{"idem-key", "Key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			m := outbox.Message{Topic: "t", Headers: map[string]string{"traceparent": "x", c.name: "v"}}
			err := m.Validate()
			if !errors.Is(err, outbox.ErrInvalid) {
				t.Fatalf("Validate = %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), `"`+c.name+`"`) || !strings.Contains(err.Error(), c.why) {
				t.Fatalf("Validate = %q: want the header's name and why (%q)", err, c.why)
			}
			s := outbox.NewMemoryStore("")
			if _, err := s.Add(t.Context(), m); !errors.Is(err, outbox.ErrInvalid) {
				t.Fatalf("Add = %v, want ErrInvalid", err)
			}
			b, err := s.Claim(t.Context(), 10)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Release(t.Context()) //nolint:errcheck // nothing to release
			if n := len(b.Messages()); n != 0 {
				t.Fatalf("the refused message was stored: %d pending", n)
			}
		})
	}
}

// TestRelayPublishFailureHoldsKey: a refused message is retried and the
// messages after it of its key wait for it; other keys go on.
func TestRelayPublishFailureHoldsKey(t *testing.T) {
	t.Parallel()
	s := outbox.NewMemoryStore("")
	var ids []string
	for _, k := range []string{"a", "a", "b"} {
		id, err := s.Add(t.Context(), outbox.Message{Topic: "t", Key: k})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	failures := 2
	rec := &outboxtest.Recorder{Fail: func(m outbox.Message) error {
		if m.ID == ids[0] && failures > 0 {
			failures--
			return errors.New("broker down")
		}
		return nil
	}}
	r, err := outbox.NewRelay(s, rec, nil)
	if err != nil {
		t.Fatal(err)
	}
	n, err := r.Once(t.Context())
	var perr *outbox.PublishError
	if !errors.As(err, &perr) || perr.ID != ids[0] || n != 1 {
		t.Fatalf("Once = %d, %v; want 1 and a PublishError for %s", n, err, ids[0])
	}
	if got := ids3(rec.Messages()); !slices.Equal(got, []string{ids[2]}) {
		t.Fatalf("published %q, want only %s (a's head failed)", got, ids[2])
	}
	if _, err := r.Once(t.Context()); err == nil {
		t.Fatal("second Once succeeded; the publisher refused again")
	}
	for range 2 {
		if _, err := r.Once(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := ids3(rec.Messages()), []string{ids[2], ids[0], ids[1]}; !slices.Equal(got, want) {
		t.Fatalf("published %q, want %q", got, want)
	}
}

func ids3(ms []outbox.Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.ID)
	}
	return out
}

// TestRelaySweeps: Run sweeps sent messages past the retention.
func TestRelaySweeps(t *testing.T) {
	t.Parallel()
	s := outbox.NewMemoryStore("")
	if _, err := s.Add(t.Context(), outbox.Message{Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	rec := &outboxtest.Recorder{}
	r, err := outbox.NewRelay(s, rec, &outbox.RelayConfig{PollInterval: time.Millisecond, Retention: time.Millisecond, SweepInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	if got := rec.WaitFor(t, 1, 10*time.Second); len(got) != 1 {
		t.Fatalf("published %d messages, want 1", len(got))
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.Len() != 0 { // the sent message is swept
		if time.Now().After(deadline) {
			t.Fatal("the relay never swept the sent message")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestNewRelayRejects(t *testing.T) {
	t.Parallel()
	s := outbox.NewMemoryStore("")
	if _, err := outbox.NewRelay(nil, &outboxtest.Recorder{}, nil); err == nil {
		t.Error("nil store accepted")
	}
	if _, err := outbox.NewRelay(s, nil, nil); err == nil {
		t.Error("nil publisher accepted")
	}
	if _, err := outbox.NewRelay(s, &outboxtest.Recorder{}, &outbox.RelayConfig{BatchSize: -1}); err == nil {
		t.Error("negative batch size accepted")
	}
}
