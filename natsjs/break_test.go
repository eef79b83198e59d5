package natsjs_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/inbox"
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
	waitFor(t, "the first message", func() bool { all, _ := effects(t, db, sqlstore.SQLite, ""); return all == 1 && settled(t, c) })
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
	waitFor(t, "the recreated stream's message settled", func() bool { return len(rec.settledIDs()) == 2 && settled(t, c) })
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
