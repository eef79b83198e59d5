package natsjstest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/natsjs"
)

// A stream that captures the consumer's own dead-letter subject (events.>
// capturing events.dead.x) would hand each dead letter back to it as a new
// message, to be handled, fail and be dead-lettered again, for ever: a
// poison message ran its handler 698 times in 4 s. NewConsumer refuses
// such a subject, unless the consumer's filter leaves it out.
func TestDeadLetterSubjectCapturedRefused(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	db, _, in := sqliteInbox(t, inbox.Config{})
	p := natsjs.HandleTx(in, db, func(context.Context, *sql.Tx, inbox.Delivery) error { return nil })
	for _, tc := range []struct {
		name   string
		filter []string
		ok     bool
	}{
		{"all the stream's subjects", nil, false},
		{"a filter that takes it", []string{e.subject + ".*.x"}, false},
		{"a filter that leaves it out", []string{e.subject + ".orders.>"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := natsjs.NewConsumer(context.Background(), e.js, p, &natsjs.Config{
				Stream: e.stream, Durable: "d" + randName(), FilterSubjects: tc.filter, DeadLetterSubject: e.subject + ".dead.x"})
			if tc.ok != (err == nil) {
				t.Fatalf("NewConsumer: %v, want ok %v", err, tc.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "own dead letters") {
				t.Fatalf("error %v does not say why", err)
			}
		})
	}
	if _, err := natsjs.NewConsumer(context.Background(), e.js, p, &natsjs.Config{Stream: e.stream, Durable: "w", DeadLetterSubject: "idem.dead.*"}); err == nil {
		t.Fatal("a wildcard dead-letter subject was accepted")
	}
}

// The stream's subjects changed after NewConsumer and now capture the
// dead-letter subject: a dead letter delivered back is terminated, never
// handled, and the poison message's handler ran MaxAttempts times only.
func TestDeadLetterDeliveredBackNotHandled(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	db, _, in := sqliteInbox(t, inbox.Config{MaxAttempts: 2, Backoff: func(int) time.Duration { return 10 * time.Millisecond }})
	var calls atomic.Int32
	h := func(context.Context, *sql.Tx, inbox.Delivery) error { calls.Add(1); return errors.New("poison") }
	var rec recorder
	dead := e.subject + "dead.x" // outside the stream's subjects (e.subject + ".>")
	// The dead letters go to a stream of their own and, once the stream
	// below is updated, to the consumed stream too.
	ctx := context.Background()
	if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: e.stream + "_D2", Subjects: []string{dead}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.js.DeleteStream(context.Background(), e.stream+"_D2") })
	c := newConsumer(t, e, natsjs.HandleTx(in, db, h), natsjs.Config{Observe: rec.observe, DeadLetterSubject: dead})
	if err := e.js.DeleteStream(ctx, e.stream+"_D2"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.UpdateStream(ctx, jetstream.StreamConfig{Name: e.stream, Subjects: []string{e.subject + ".>", dead}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	run(t, c)
	e.publish(t, "x", "m", "{}")
	obstest.WaitFor(t, "the dead letter delivered back", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for _, ev := range rec.evs {
			if ev.Action == natsjs.Terminated {
				return true
			}
		}
		return false
	})
	time.Sleep(300 * time.Millisecond) // a loop would have run the handler again by now
	if n := calls.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2 (MaxAttempts)", n)
	}
	if got := fmt.Sprint(rec.of("m")); got != "[retry/naked@1 dead/dead-lettered@2]" {
		t.Fatalf("events of m %s", got)
	}
}

// Dead letters of two lives of a stream (deleted and created again, so
// that it numbers its messages from 1 again) are two dead letters: their
// Nats-Msg-Id was "dead:<stream>:<durable>:<seq>" and the dead-letter
// stream dropped the second as a duplicate of the first.
func TestDeadLetterIDsAcrossStreamRecreated(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	db, _, in := sqliteInbox(t, inbox.Config{MaxAttempts: 1})
	h := func(context.Context, *sql.Tx, inbox.Delivery) error { return errors.New("poison") }
	var rec recorder
	cfg := natsjs.Config{Observe: rec.observe}
	p := natsjs.HandleTx(in, db, h)
	ctx := context.Background()
	for life := range 2 {
		if life > 0 {
			if err := e.js.DeleteStream(ctx, e.stream); err != nil {
				t.Fatal(err)
			}
			if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: e.stream, Subjects: []string{e.subject + ".>"}, Storage: jetstream.MemoryStorage}); err != nil {
				t.Fatal(err)
			}
		}
		c := newConsumer(t, e, p, cfg)
		stop := run(t, c)
		if ack := e.publish(t, "x", "", "poison"); ack.Sequence != 1 {
			t.Fatalf("life %d: first message at %d", life, ack.Sequence)
		}
		obstest.WaitFor(t, "the dead letter", func() bool { return e.streamMsgs(t, e.dead) == uint64(life+1) })
		stop()
	}
}

// A durable created with a server-side MaxDeliver (by an earlier version
// of this package) is updated to an unlimited one by NewConsumer, so the
// server never drops a message the consumer could not dead-letter yet.
func TestDurableMaxDeliverUpdated(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	ctx := context.Background()
	if _, err := e.js.CreateOrUpdateConsumer(ctx, e.stream, jetstream.ConsumerConfig{Durable: "old", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 20}); err != nil {
		t.Fatal(err)
	}
	db, _, in := sqliteInbox(t, inbox.Config{})
	c := newConsumer(t, e, natsjs.HandleTx(in, db, func(context.Context, *sql.Tx, inbox.Delivery) error { return nil }), natsjs.Config{Durable: "old"})
	info, err := c.JetStreamConsumer().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxDeliver != -1 {
		t.Fatalf("the durable's MaxDeliver is %d, want -1 (unlimited)", info.Config.MaxDeliver)
	}
}

// An operator retries a dead letter once its cause is fixed by publishing
// it again, headers and all, on the subject it was dead-lettered from
// (under a new ID: the first one's record is dead). The consumer took it
// for a dead letter of its own delivered back (by its Idem-Dead-Consumer
// and Idem-Dead-Stream headers) and terminated it: the retry was neither
// handled nor dead-lettered, lost.
func TestDeadLetterRepublishedByOperatorHandled(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	db, _, in := sqliteInbox(t, inbox.Config{MaxAttempts: 2, Backoff: func(int) time.Duration { return 10 * time.Millisecond }})
	var broken atomic.Bool
	broken.Store(true)
	var handled atomic.Int32
	h := func(context.Context, *sql.Tx, inbox.Delivery) error {
		if broken.Load() {
			return errors.New("bug")
		}
		handled.Add(1)
		return nil
	}
	var rec recorder
	c := newConsumer(t, e, natsjs.HandleTx(in, db, h), natsjs.Config{Observe: rec.observe})
	run(t, c)
	e.publish(t, "x", "m", "{}")
	obstest.WaitFor(t, "the dead letter", func() bool { return e.streamMsgs(t, e.dead) == 1 })
	dl := deadLetters(t, e, 1)[0]
	broken.Store(false) // the bug is fixed
	again := nats.NewMsg(dl.Headers().Get(natsjs.DeadSubjectHeader))
	again.Data = dl.Data()
	for k, v := range dl.Headers() {
		again.Header[k] = v
	}
	if _, err := e.js.PublishMsg(t.Context(), again, jetstream.WithMsgID("m-retry")); err != nil {
		t.Fatal(err)
	}
	obstest.WaitFor(t, "the retry settled", func() bool { return rec.count("m-retry") == 1 && settled(t, c) })
	if got := fmt.Sprint(rec.of("m-retry")); got != "[processed/acked@1]" || handled.Load() != 1 {
		t.Fatalf("events of the retry %s, handled %d times; want processed/acked once", got, handled.Load())
	}
}
