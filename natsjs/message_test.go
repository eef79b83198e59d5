package natsjs_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/natsjs"
	"github.com/idemkit/idem/outbox"
)

// The consumer's tests with an inbox (HandleTx on SQLite and PostgreSQL,
// a NATS connection through a proxy, child processes) are in
// cmd/internal/natsjstest, so that this module does not require sqlstore
// and its drivers.

func TestMessage(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	m := nats.NewMsg(e.subject + ".order.paid")
	m.Data = []byte("p")
	m.Header.Set(natsjs.KeyHeader, "order-1")
	m.Header.Set("Event", "paid")
	if _, err := e.js.PublishMsg(t.Context(), m, jetstream.WithMsgID("id-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.PublishMsg(t.Context(), nats.NewMsg(e.subject+".x")); err != nil {
		t.Fatal(err)
	}
	cons, err := e.js.CreateOrUpdateConsumer(t.Context(), e.stream, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for msg := range batch.Messages() {
		im, err := natsjs.Message(msg)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %s %s %q %s", im.ID, im.Topic, im.Key, im.Payload, im.Headers["Event"]))
	}
	want := fmt.Sprintf("[id-1 %[1]s.order.paid order-1 \"p\" paid %[2]s %[1]s.x  \"\" ]", e.subject, seqID(t, e, 2))
	if fmt.Sprint(got) != want {
		t.Fatalf("messages %s\nwant %s", got, want)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	p := natsjs.Process(func(context.Context, inbox.Message) (inbox.Outcome, error) { return inbox.Outcome{}, nil })
	for _, tc := range []struct {
		name string
		cfg  *natsjs.Config
		want string
	}{
		{"nil", nil, "needs"},
		{"no stream", &natsjs.Config{Durable: "d"}, "required"},
		{"no durable", &natsjs.Config{Stream: "S"}, "required"},
		{"dotted durable", &natsjs.Config{Stream: "S", Durable: "a.b"}, "durable name"},
		{"short ack wait", &natsjs.Config{Stream: "S", Durable: "d", AckWait: time.Millisecond}, "shorter"},
		{"negative workers", &natsjs.Config{Stream: "S", Durable: "d", Workers: -1}, "negative"},
		{"no stream on the server", &natsjs.Config{Stream: "NO_SUCH_" + randName(), Durable: "d"}, "create consumer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := natsjs.NewConsumer(t.Context(), js, p, tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one containing %q", err, tc.want)
			}
		})
	}
	pub, err := natsjs.NewPublisher(js, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(t.Context(), outbox.Message{Topic: "x"}); !errors.Is(err, natsjs.ErrNoID) {
		t.Fatalf("publish without an ID: %v", err)
	}
}
