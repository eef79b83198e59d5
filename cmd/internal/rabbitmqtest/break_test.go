package rabbitmqtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/rabbitmq"
)

// The queue is deleted under a running consumer (an operator, a policy, a
// redeploy that recreates the topology): the broker cancels the consumer
// (basic.cancel) but keeps the channel open. The consumer must start a new
// session, in which Setup declares the queue again, and consume what is
// published to it then.
func TestConsumerQueueDeleted(t *testing.T) {
	t.Parallel()
	b := newBroker(t, nil)
	st := sqliteStore(t)
	in := st.inbox(t, inbox.Config{})
	cfg := b.consumerConfig()
	cfg.Setup = func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(b.queue, false, false, false, false, nil)
		return err
	}
	var s seen
	run(t, cfg, s.wrap(rabbitmq.HandleTx(in, st.db, st.effect("p"))))
	b.publish(t, "before", "x")
	eventually(t, 30*time.Second, "the first effect", func() bool { return st.effectsOf(t, "before") == 1 })

	if _, err := b.ch.QueueDelete(b.queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	// The consumer's Setup declares the queue again in its next session;
	// until then a passive declare fails (and closes its channel).
	conn, err := amqp.Dial(b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	eventually(t, 20*time.Second, "the consumer to declare the queue again and consume it", func() bool {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(b.queue, false, false, false, false, nil)
		return err == nil && q.Consumers == 1
	})
	b.publish(t, "after", "x")
	eventually(t, 30*time.Second, "the effect of the message published after the queue was recreated", func() bool {
		return st.effectsOf(t, "after") == 1
	})
}

// The dead-letter queue is missing (not declared yet, deleted): the dead
// message's publish is returned unroutable, and the delivery is requeued,
// not acked and lost. It must be requeued after a delay, as a Retry is,
// not at once: an immediate requeue redelivers it at once, and the
// consumer spins on it — an inbox claim, a publish and a log line each
// time — as fast as the broker and the database answer, until the queue
// appears. Once the queue is declared, the message is dead-lettered.
func TestConsumerDeadLetterQueueMissing(t *testing.T) {
	t.Parallel()
	b := newBroker(t, nil)
	if _, err := b.ch.QueueDelete(b.dlq, false, false, false); err != nil {
		t.Fatal(err)
	}
	st := sqliteStore(t)
	in := st.inbox(t, inbox.Config{})
	b.publish(t, "", "no id") // dead at once: inbox.ErrNoID
	cfg := b.consumerConfig()
	cfg.MaxRetryDelay = 500 * time.Millisecond
	var s seen
	run(t, cfg, s.wrap(rabbitmq.HandleTx(in, st.db, st.effect("p"))))
	eventually(t, 30*time.Second, "the first delivery", func() bool { return len(s.all()) >= 1 })
	first := time.Now()
	time.Sleep(2 * time.Second) // the window in which deliveries are counted
	n := len(s.all())
	// With a requeue after MaxRetryDelay (500 ms): at most about 5 in 2 s;
	// an immediate requeue gives hundreds or thousands.
	if limit := 2*int(time.Since(first)/cfg.MaxRetryDelay) + 2; n > limit {
		t.Errorf("%d deliveries of the dead message in %v while its dead-letter queue was missing, want at most %d (one per MaxRetryDelay)", n, time.Since(first).Round(time.Millisecond), limit)
	}
	if _, err := b.ch.QueueDeclare(b.dlq, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the message in the dead-letter queue", func() bool { m, _ := b.depth(t, b.dlq); return m == 1 })
	eventually(t, 10*time.Second, "the queue to be empty", func() bool { m, _ := b.depth(t, b.queue); return m == 0 })
}

// Message IDs from another producer that the inbox refuses (not UTF-8, a
// control character) are
// dead-lettered with the reason, not acked and lost, nor spun on; the
// longest that AMQP carries (255 bytes) is handled.
func TestConsumerHostileMessageIDs(t *testing.T) {
	t.Parallel()
	b := newBroker(t, nil)
	st := sqliteStore(t)
	in := st.inbox(t, inbox.Config{})
	long := strings.Repeat("é", 127) + "x" // 255 bytes
	bad := []string{"\xff\xfe", "a\x00b", "line\nbreak", "\x1b[31m"}
	for _, id := range bad {
		b.publish(t, id, "x")
	}
	b.publish(t, long, "x")
	run(t, b.consumerConfig(), rabbitmq.HandleTx(in, st.db, st.effect("p")))
	eventually(t, 30*time.Second, "the refused IDs dead-lettered", func() bool { n, _ := b.depth(t, b.dlq); return n == len(bad) })
	eventually(t, 30*time.Second, "the 255-byte ID handled", func() bool { return st.effectsOf(t, long) == 1 })
	got := map[string]bool{}
	for _, d := range b.drain(t, b.dlq) {
		got[d.MessageId] = true
		if r := fmt.Sprint(d.Headers[rabbitmq.HeaderDeadReason]); !strings.Contains(r, "invalid") {
			t.Errorf("dead %q: reason %q", d.MessageId, r)
		}
	}
	for _, id := range bad {
		if !got[id] {
			t.Errorf("%q not dead-lettered under its ID (got %v)", id, got)
		}
	}
	if rows, _ := st.effects(t); rows != 1 {
		t.Errorf("%d effects, want 1", rows)
	}
}

// MaxDeliver on a quorum queue: the MaxDeliver-th delivery of a message
// that keeps failing is dead-lettered. A first delivery carries no
// x-delivery-count, so it counted as unknown and MaxDeliver 1 let a
// second delivery through.
func TestConsumerMaxDeliverQuorum(t *testing.T) {
	t.Parallel()
	for _, max := range []int{1, 3} {
		t.Run(fmt.Sprint(max), func(t *testing.T) {
			t.Parallel()
			b := newBroker(t, amqp.Table{"x-queue-type": "quorum"})
			var calls atomic.Int32
			h := func(_ context.Context, m inbox.Message) (inbox.Outcome, error) {
				calls.Add(1)
				return inbox.Outcome{Result: inbox.Retry, ID: m.ID, Delay: 10 * time.Millisecond, Err: errors.New("down")}, nil
			}
			cfg := b.consumerConfig()
			cfg.MaxDeliver = max
			b.publish(t, "m", "x")
			run(t, cfg, h)
			eventually(t, 30*time.Second, "the dead letter", func() bool { n, _ := b.depth(t, b.dlq); return n == 1 })
			eventually(t, 10*time.Second, "the queue to be empty", func() bool { n, _ := b.depth(t, b.queue); return n == 0 })
			if n := calls.Load(); n != int32(max) {
				t.Fatalf("%d deliveries handled before the dead letter, want %d (MaxDeliver)", n, max)
			}
			dl := b.drain(t, b.dlq)
			if len(dl) != 1 || !strings.Contains(fmt.Sprint(dl[0].Headers[rabbitmq.HeaderDeadReason]), fmt.Sprintf("delivered %d times", max)) {
				t.Fatalf("dead letters %+v", dl)
			}
		})
	}
}

// A Setup that panics (a topology bug, a nil map) ended the process: it
// is now a failed session, retried after ReconnectDelay like a Setup
// that returns an error, and the consumer goes on once Setup works.
func TestConsumerSetupPanics(t *testing.T) {
	t.Parallel()
	b := newBroker(t, nil)
	st := sqliteStore(t)
	in := st.inbox(t, inbox.Config{})
	var setups atomic.Int32
	cfg := b.consumerConfig()
	cfg.Setup = func(*amqp.Channel) error {
		if setups.Add(1) <= 2 {
			panic("topology bug")
		}
		return nil
	}
	b.publish(t, "m", "x")
	var s seen
	run(t, cfg, s.wrap(rabbitmq.HandleTx(in, st.db, st.effect("p"))))
	eventually(t, 30*time.Second, "the message handled", func() bool { return s.count(inbox.Processed) == 1 })
	if n := st.effectsOf(t, "m"); n != 1 || setups.Load() != 3 {
		t.Fatalf("%d effects after %d setups, want 1 after 3", n, setups.Load())
	}
}
