package natsjstest

import (
	"context"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/inbox/consumertest"
	"github.com/idemkit/idem/natsjs"
)

// TestConformance runs the consumer protocol's suite over NATS
// JetStream.
func TestConformance(t *testing.T) {
	t.Parallel()
	consumertest.Run(t, func(t testing.TB) consumertest.Broker { return &conformance{e: setup(t, 0)} })
}

// conformance is the suite's harness: a stream of the test's own, its
// dead-letter stream (deleted while dead letters are broken), and the
// adapter's consumer.
type conformance struct {
	e    env
	c    *natsjs.Consumer
	stop func()
	mu   sync.Mutex
	read uint64 // the dead-letter stream's last sequence read
}

func (c *conformance) Publish(t testing.TB, m inbox.Message) {
	t.Helper()
	msg := nats.NewMsg(c.e.subject + ".event")
	msg.Data = m.Payload
	for k, v := range m.Headers {
		msg.Header.Set(k, v)
	}
	var opts []jetstream.PublishOpt
	if m.ID != "" {
		opts = append(opts, jetstream.WithMsgID(m.ID))
	}
	if _, err := c.e.js.PublishMsg(t.Context(), msg, opts...); err != nil {
		t.Fatal(err)
	}
}

func (c *conformance) Consume(t testing.TB, cfg inbox.ConsumerConfig) {
	t.Helper()
	nc := natsjs.Config{Workers: 2, MaxDeliver: cfg.MaxDeliver, DeriveFrom: cfg.DeriveFrom, Backoff: cfg.Backoff}
	if nc.MaxDeliver == 0 {
		nc.MaxDeliver = -1
	}
	c.c = newConsumer(t, c.e, cfg.Process, nc)
	c.stop = run(t, c.c)
}

func (c *conformance) Stop(testing.TB) { c.stop() }

func (c *conformance) Settled(t testing.TB) bool { return settled(t, c.c) }

func (c *conformance) DeadLetters(t testing.TB) []string {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx := context.Background()
	s, err := c.e.js.Stream(ctx, c.e.dead)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for ; c.read < info.State.LastSeq; c.read++ {
		m, err := s.GetMsg(ctx, c.read+1)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.Header.Get(natsjs.DeadIDHeader))
	}
	return ids
}

func (c *conformance) BreakDeadLetters(t testing.TB, broken bool) {
	t.Helper()
	ctx := context.Background()
	var err error
	if broken {
		err = c.e.js.DeleteStream(ctx, c.e.dead)
	} else {
		_, err = c.e.js.CreateStream(ctx, jetstream.StreamConfig{Name: c.e.dead, Subjects: []string{natsjs.DefaultDeadLetterPrefix + c.e.stream + ".>"}, Storage: jetstream.MemoryStorage})
	}
	if err != nil {
		t.Fatal(err)
	}
}
