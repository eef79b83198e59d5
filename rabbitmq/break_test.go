package rabbitmq_test

import (
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
