package natsjstest

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/natsjs"
	"github.com/idemkit/idem/sqlstore"
)

// A message without Nats-Msg-Id is kept under an ID made of its stream
// and sequence. A stream deleted and created again (a redeploy, an
// operator resetting it) numbers its messages from 1 again: the new
// stream's first message must not be taken for a duplicate of the old
// stream's first, whose record the inbox still holds — its effect would be
// lost.
func TestMessageIDAcrossStreamRecreated(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	db, _, in := sqliteInbox(t, inbox.Config{})
	var rec recorder
	cfg := natsjs.Config{Observe: rec.observe}
	p := natsjs.HandleTx(in, db, effect(sqlstore.SQLite, "p"))
	c := newConsumer(t, e, p, cfg)
	stop := run(t, c)
	e.publish(t, "x", "", "before")
	obstest.WaitFor(t, "the first message", func() bool { all, _ := effects(t, db, sqlstore.SQLite, ""); return all == 1 && settled(t, c) })
	stop()

	ctx := context.Background()
	if err := e.js.DeleteStream(ctx, e.stream); err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: e.stream, Subjects: []string{e.subject + ".>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	c = newConsumer(t, e, p, cfg)
	run(t, c)
	if ack := e.publish(t, "x", "", "after"); ack.Sequence != 1 {
		t.Fatalf("the recreated stream stored its first message at %d, want 1", ack.Sequence)
	}
	obstest.WaitFor(t, "the recreated stream's message settled", func() bool { return len(rec.settledIDs()) == 2 && settled(t, c) })
	if all, _ := effects(t, db, sqlstore.SQLite, ""); all != 2 {
		t.Fatalf("%d effects of two different messages (events %v), want 2", all, rec.settledIDs())
	}
}

// settledIDs returns the ID and the result of each event.
func (r *recorder) settledIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, ev := range r.evs {
		out = append(out, ev.Message.ID+" "+ev.Outcome.Result.String())
	}
	return out
}

// The durable consumer is deleted under a running Consumer (an operator,
// a redeploy that recreates the topology): the server ends the pulls
// with "consumer deleted" and the client stops consuming. Run must
// create the consumer again and go on: a message published after the
// deletion has its effect, without restarting the process.
func TestConsumerDeletedUnderRun(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	db, _, in := sqliteInbox(t, inbox.Config{})
	var rec recorder
	c := newConsumer(t, e, natsjs.HandleTx(in, db, effect(sqlstore.SQLite, "p")), natsjs.Config{Observe: rec.observe})
	run(t, c)
	e.publish(t, "x", "before", "a")
	obstest.WaitFor(t, "the first message", func() bool { _, of := effects(t, db, sqlstore.SQLite, "before"); return of == 1 })
	if err := e.js.DeleteConsumer(context.Background(), e.stream, "loyalty"); err != nil {
		t.Fatal(err)
	}
	e.publish(t, "x", "after", "b")
	obstest.WaitFor(t, "the message published after the consumer was deleted", func() bool {
		_, of := effects(t, db, sqlstore.SQLite, "after")
		return of == 1
	})
}
