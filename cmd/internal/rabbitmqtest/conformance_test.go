package rabbitmqtest

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/inbox/consumertest"
)

// TestConformance runs the consumer protocol's suite over RabbitMQ, on
// a quorum queue: its delivery count makes MaxDeliver bite.
func TestConformance(t *testing.T) {
	t.Parallel()
	consumertest.Run(t, func(t testing.TB) consumertest.Broker {
		return &conformance{b: newBroker(t, amqp.Table{"x-queue-type": "quorum"})}
	})
}

// conformance is the suite's harness: a queue of the test's own, its
// dead-letter queue (deleted while dead letters are broken), and the
// adapter's consumer.
type conformance struct {
	b    *broker
	stop func()
}

func (c *conformance) Publish(t testing.TB, m inbox.Message) {
	t.Helper()
	h := amqp.Table{}
	for k, v := range m.Headers {
		h[k] = v
	}
	err := c.b.ch.PublishWithContext(t.Context(), "", c.b.queue, true, false, amqp.Publishing{
		MessageId: m.ID, Headers: h, Body: m.Payload, DeliveryMode: amqp.Persistent,
	})
	if err != nil {
		t.Fatal(err)
	}
}

func (c *conformance) Consume(t testing.TB, cfg inbox.ConsumerConfig) {
	t.Helper()
	rc := c.b.consumerConfig()
	rc.MaxDeliver, rc.DeriveFrom, rc.Backoff = cfg.MaxDeliver, cfg.DeriveFrom, cfg.Backoff
	rc.Workers = 2
	c.stop = run(t, rc, cfg.Process)
}

func (c *conformance) Stop(testing.TB) { c.stop() }

// Settled: the consumer is gone (its channel's close requeued what it
// held unacked) and the queue is empty.
func (c *conformance) Settled(t testing.TB) bool {
	n, consumers := c.b.depth(t, c.b.queue)
	return n == 0 && consumers == 0
}

func (c *conformance) DeadLetters(t testing.TB) []string {
	t.Helper()
	var ids []string
	for _, d := range c.b.drain(t, c.b.dlq) {
		ids = append(ids, d.MessageId)
	}
	return ids
}

func (c *conformance) BreakDeadLetters(t testing.TB, broken bool) {
	t.Helper()
	var err error
	if broken {
		_, err = c.b.ch.QueueDelete(c.b.dlq, false, false, false)
	} else {
		_, err = c.b.ch.QueueDeclare(c.b.dlq, false, false, false, false, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
}
