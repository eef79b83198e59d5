package rabbitrestart

import (
	"context"
	"fmt"
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
	// drained waits until each queue's load is drained and returns
	// when each was first seen drained (a queue's wait must not hold
	// the other's figure back).
	drained := func(since time.Time) map[string]time.Duration {
		at := map[string]time.Duration{}
		deadline := time.Now().Add(3 * time.Minute)
		for {
			for _, q := range queues {
				if _, ok := at[q.name]; !ok && q.load.Drained(t) {
					at[q.name] = time.Since(since).Round(time.Millisecond)
				}
			}
			if len(at) == len(queues) {
				return at
			}
			if time.Now().After(deadline) {
				// Say where it stuck: the outbox (publishing), the
				// broker (ready messages, consumers) or the handlers.
				for _, q := range queues {
					if _, ok := at[q.name]; ok {
						continue
					}
					info := n.info(t, q.name, q.args)
					t.Errorf("%s queue not drained: %s; in the broker: %s", q.name, q.load.Status(t), info)
				}
				t.Fatalf("timed out after 3m0s waiting for every event published and handled; the node's log ends:\n%s", n.Tail(t))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for _, q := range queues {
		q.load.WaitEffects(t, 100, time.Minute)
	}

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
		at := drained(killed) // the events of the outage too
		t.Logf("round %d: killed, restarted after %v down, up (AMQP) after %v, every event so far handled after %v",
			round+1, down.Round(time.Millisecond), up.Round(time.Millisecond), at)
	}
	for _, q := range queues {
		q.load.WaitEffects(t, q.load.Effects(t)+100, time.Minute)
	}
	for _, stop := range stops {
		stop()
	}
	drained(time.Now())
	for _, q := range queues {
		outboxload.Eventually(t, time.Minute, q.name+" empty", func() bool {
			m, found := n.depth(t, q.name, true, q.args)
			return found && m == 0
		})
	}
	for _, q := range queues {
		f := q.load.Check(t, q.load.Tally.Acked())
		if dead, found := n.depth(t, q.name+".dead", true, nil); dead != 0 || !found {
			t.Errorf("%s: %d dead letters (queue found: %v)", q.name, dead, found)
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
	}{{"transient", false}, {"durable", true}}
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
	// The durable queue comes back with its messages (allowing for
	// its recovery after the node took connections); then the
	// transient one is known to be gone, not late.
	var (
		kept      int
		recovered bool
	)
	defer func() {
		if t.Failed() {
			t.Logf("the durable queue last seen: found %v, %d of %d messages", recovered, kept, count)
		}
	}()
	// Three minutes: a node restarted on a loaded CI machine (a load of
	// 16) once took more than one to recover its queues.
	outboxload.Eventually(t, 3*time.Minute, "the durable queue recovered", func() bool {
		kept, recovered = n.depth(t, "durable", true, nil)
		return recovered && kept == count
	})
	lost, found := n.depth(t, "transient", false, nil)
	if found || lost != 0 {
		t.Errorf("the transient queue after the restart: found %v, %d messages; want it gone", found, lost)
	}
	t.Logf("after the node was killed and restarted: durable queue %d of %d confirmed messages, transient queue found: %v (%d)", kept, count, found, lost)
}
