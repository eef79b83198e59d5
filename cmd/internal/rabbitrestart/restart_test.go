package rabbitrestart

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // "pgx" for testdb.Postgres
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/cmd/internal/outboxload"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/rabbitmq"
)

// TestNodeKilledUnderLoad: business transactions commit events into
// two outboxes every 10 ms; relays publish them under confirms into a
// durable classic queue and a quorum queue, and inbox consumers
// (HandleTx) write one effect row per message. Mid-load the node is
// killed (SIGKILL) and started again on its data. At the end every
// committed event was delivered, has exactly one effect row, and no
// delivery was dead-lettered. IDEM_FAILOVER_ROUNDS kills (default 1).
func TestNodeKilledUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a RabbitMQ node")
	}
	t.Parallel()
	began := time.Now()
	rounds := outboxload.Rounds(t)
	n := startNode(t)
	booted := time.Since(began)
	ch := n.channel(t)
	type queue struct {
		name string
		args amqp.Table
		load *outboxload.Load
	}
	queues := []*queue{
		{name: "classic", args: amqp.Table{"x-queue-type": "classic"}},
		{name: "quorum", args: amqp.Table{"x-queue-type": "quorum"}},
	}
	for _, q := range queues {
		for _, d := range []struct {
			name string
			args amqp.Table
		}{{q.name, q.args}, {q.name + ".dead", nil}} {
			if _, err := ch.QueueDeclare(d.name, true, false, false, false, d.args); err != nil {
				t.Fatalf("declare %s: %v", d.name, err)
			}
		}
		db, _ := testdb.Postgres(t)
		q.load = outboxload.New(t, db, func(int) string { return q.name })
		p, err := rabbitmq.NewPublisher(&rabbitmq.PublisherConfig{URL: n.url, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		q.load.Relay(t, p, 200*time.Millisecond)
		c, err := rabbitmq.NewConsumer(&rabbitmq.ConsumerConfig{
			URL: n.url, Queue: q.name, DeadLetterRoutingKey: q.name + ".dead", Workers: 4,
			ReconnectDelay: 100 * time.Millisecond, MaxReconnect: time.Second,
			Observe: func(s inbox.Settled) {
				again := s.Message.Headers[rabbitmq.HeaderRedelivered] == "true"
				q.load.Tally.Add(s.Message.ID, s.Action, s.Outcome.Result, again, s.StoreErrors)
			},
		}, q.load.Handler())
		if err != nil {
			t.Fatal(err)
		}
		outboxload.RunUntilCleanup(t, q.name+" consumer", c.Run)
	}
	var stops []func() int
	for _, q := range queues {
		stops = append(stops, q.load.Produce(t, 10*time.Millisecond))
	}
	each := func(f func(q *queue)) {
		var wg sync.WaitGroup
		for _, q := range queues {
			wg.Go(func() { f(q) })
		}
		wg.Wait()
	}
	each(func(q *queue) { q.load.WaitEffects(t, 100, time.Minute) })

	for round := range rounds {
		killed := time.Now()
		n.Kill(t)
		// Events commit while the node is down, and stay pending.
		for _, q := range queues {
			c := q.load.Committed()
			outboxload.Eventually(t, time.Minute, "events committed while the node is down", func() bool {
				return q.load.Committed() >= c+50
			})
		}
		down := time.Since(killed)
		n.restart(t)
		up := time.Since(killed)
		each(func(q *queue) {
			q.load.Drain(t, 2*time.Minute) // waits for the events of the outage too
			t.Logf("round %d: %s queue: every event so far handled %v after the kill", round+1, q.name, time.Since(killed).Round(time.Millisecond))
		})
		t.Logf("round %d: killed, restarted after %v down, up (AMQP) after %v, every event so far handled after %v",
			round+1, down.Round(time.Millisecond), up.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
	}
	each(func(q *queue) { q.load.WaitEffects(t, q.load.Effects(t)+100, time.Minute) })
	for _, stop := range stops {
		stop()
	}
	each(func(q *queue) { q.load.Drain(t, 2*time.Minute) })
	ch = n.channel(t) // the first died with the node
	for _, q := range queues {
		outboxload.Eventually(t, time.Minute, q.name+" empty", func() bool {
			d, err := ch.QueueDeclarePassive(q.name, true, false, false, false, q.args)
			return err == nil && d.Messages == 0
		})
	}
	for _, q := range queues {
		f := q.load.Check(t, q.load.Tally.Acked())
		dead, err := ch.QueueDeclarePassive(q.name+".dead", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if dead.Messages != 0 {
			t.Errorf("%s: %d dead letters", q.name, dead.Messages)
		}
		t.Logf("%s queue, %d kill(s), node booted in %v, run %v: %v", q.name, rounds, booted.Round(time.Millisecond), time.Since(began).Round(time.Second), f)
	}
}

// TestTransientQueueForgetsConfirmed shows where RabbitMQ's own
// guarantee stops: a message confirmed into a transient (non-durable)
// queue — the relay would mark it sent — is gone with the queue when the
// node restarts; in a durable queue it survives. The outbox cannot help:
// it re-publishes only what the broker did not confirm. Declare the
// queues durable (and the adapter publishes persistent messages).
func TestTransientQueueForgetsConfirmed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a RabbitMQ node")
	}
	t.Parallel()
	n := startNode(t)
	ch := n.channel(t)
	const count = 20
	p, err := rabbitmq.NewPublisher(&rabbitmq.PublisherConfig{URL: n.url, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	queues := []struct {
		name    string
		durable bool
		kept    int
	}{{"transient", false, 0}, {"durable", true, count}}
	for _, q := range queues {
		if _, err := ch.QueueDeclare(q.name, q.durable, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		for i := range count {
			m := outbox.Message{ID: fmt.Sprint(q.name, "-", i), Topic: q.name, Payload: []byte("{}")}
			if err := p.Publish(context.Background(), m); err != nil {
				t.Fatalf("publish %s: %v (not confirmed)", m.ID, err)
			}
		}
	}
	n.Kill(t)
	n.restart(t)
	ch = n.channel(t)
	for _, q := range queues {
		got := 0
		d, err := ch.QueueDeclarePassive(q.name, q.durable, false, false, false, nil)
		var amqpErr *amqp.Error
		switch {
		case err == nil:
			got = d.Messages
		case errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound:
			ch = n.channel(t) // a failed passive declare closes the channel
		default:
			t.Fatal(err)
		}
		if got != q.kept {
			t.Errorf("%s queue: %d of %d confirmed messages after the restart, want %d", q.name, got, count, q.kept)
		}
		t.Logf("%s queue: %d of %d confirmed messages after the node was killed and restarted (queue found: %v)", q.name, got, count, err == nil)
	}
}
