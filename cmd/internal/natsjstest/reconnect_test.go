package natsjstest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/natsjs"
	"github.com/idemkit/idem/sqlstore"
)

// viaProxy connects to the NATS server through a netfault proxy, with
// opts, and returns the proxy and the connection's JetStream.
func viaProxy(t testing.TB, opts ...nats.Option) (*netfault.Proxy, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	u, err := url.Parse(testenv.NATS.Need(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := netfault.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	u.Host = p.Addr()
	nc, err := nats.Connect(u.String(), append([]nats.Option{nats.Name(t.Name())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return p, nc, js
}

// running is a consumer's Run in a goroutine: done is closed when Run
// returned err.
type running struct {
	done chan struct{}
	err  error
}

func start(t testing.TB, c *natsjs.Consumer) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = c.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(time.Minute):
			t.Error("Run did not return after its context ended")
		}
	})
	return r
}

// stillRunning fails t if Run returned.
func (r *running) stillRunning(t testing.TB, when string) {
	t.Helper()
	select {
	case <-r.done:
		t.Fatalf("Run returned %v %s", r.err, when)
	default:
	}
}

// drained reports whether the durable has nothing left to deliver and
// nothing awaiting an ack.
func drained(t testing.TB, c *natsjs.Consumer) bool {
	t.Helper()
	info, err := c.JetStreamConsumer().Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.NumPending == 0 && info.NumAckPending == 0
}

// TestConsumerReconnects: a consumer (HandleTx on PostgreSQL, 4 workers)
// reaches NATS through a proxy. While messages flow (with duplicates,
// some dropped by the stream's window and some stored twice), every
// connection is cut twice: the first time new connections are refused
// for a few seconds, the second time they hang. The client reconnects,
// the consumer resumes by itself (Run does not return), every distinct
// message's effect happens once, and the durable ends with nothing
// pending nor awaiting an ack.
func TestConsumerReconnects(t *testing.T) {
	if testing.Short() {
		t.Skip("cuts connections for seconds")
	}
	t.Parallel()
	e := setup(t, minWindow)
	proxy, nc, js := viaProxy(t, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.Timeout(time.Second))
	db, _ := testdb.Postgres(t)
	db.SetMaxOpenConns(4)
	s, in := inboxOn(t, db, sqlstore.PostgreSQL, inbox.Config{})
	ce := e
	ce.js = js
	var acked atomic.Int64
	c := newConsumer(t, ce, natsjs.HandleTx(in, db, effect(sqlstore.PostgreSQL, "p")), natsjs.Config{
		Workers: 4, AckWait: 2 * time.Second, AckTimeout: time.Second,
		Observe: func(ev natsjs.Event) {
			if ev.Action == natsjs.Acked {
				acked.Add(1)
			}
		},
	})
	r := start(t, c)

	distinct := map[string]bool{}
	next := 0
	publish := func(n int) {
		for range n {
			id := fmt.Sprint("m-", next)
			next++
			distinct[id] = true
			e.publish(t, "order.paid", id, id)
			if next%10 == 0 {
				e.publish(t, "order.paid", id, id) // within the window: dropped by the stream
			}
		}
	}
	republish := func(from, to int) { // past the window: stored again
		time.Sleep(minWindow + minWindow/2)
		for i := from; i < to; i += 7 {
			id := fmt.Sprint("m-", i)
			e.publishAgain(t, "order.paid", id, id)
		}
	}
	rows := func() int { all, _ := effects(t, db, sqlstore.PostgreSQL, ""); return all }

	publish(150)
	obstest.WaitFor(t, "the first effects", func() bool { return rows() >= 40 })

	for cut, mode := range []string{"refused", "hanging"} {
		reconnects := nc.Stats().Reconnects
		if mode == "refused" {
			proxy.Refuse(true)
		} else {
			proxy.Stall()
		}
		proxy.Drop()
		obstest.WaitFor(t, "the consumer's connection to notice the cut", func() bool { return !nc.IsConnected() })
		before := rows()
		publish(100)
		republish(0, next)
		// The outage lasts a few seconds: several reconnect attempts fail
		// (refused, or timed out on a server that does not answer).
		time.Sleep(3 * time.Second)
		if nc.IsConnected() {
			t.Fatalf("cut %d (%s): the connection is back during the outage", cut, mode)
		}
		r.stillRunning(t, "during the outage")
		if mode == "refused" {
			proxy.Refuse(false)
		} else {
			proxy.Resume()
		}
		obstest.WaitFor(t, "the reconnect", func() bool { return nc.IsConnected() && nc.Stats().Reconnects > reconnects })
		obstest.WaitFor(t, "effects after the reconnect", func() bool { return rows() > before })
		t.Logf("cut %d (%s): %d effects before, %d reconnects", cut, mode, before, nc.Stats().Reconnects)
	}
	publish(50)
	republish(next-50, next)

	obstest.WaitFor(t, "every message consumed and acked", func() bool {
		return rows() >= len(distinct) && drained(t, c)
	})
	r.stillRunning(t, "after the cuts")
	var n, ids, succeeded int
	if err := db.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT message_id) FROM effects`).Scan(&n, &ids); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`SELECT COUNT(*) FROM idem_inbox WHERE status = 'succeeded'`).Scan(&succeeded); err != nil {
		t.Fatal(err)
	}
	stored := e.streamMsgs(t, e.stream)
	t.Logf("%d distinct messages, %d stored, %d acks, %d effects", len(distinct), stored, acked.Load(), n)
	if n != len(distinct) || ids != len(distinct) || succeeded != len(distinct) {
		t.Fatalf("%d effects of %d messages, %d succeeded records; want %d of each", n, ids, succeeded, len(distinct))
	}
	if stored <= uint64(len(distinct)) {
		t.Fatalf("the stream holds %d messages for %d IDs: no duplicate reached the consumer", stored, len(distinct))
	}
	if acked.Load() < int64(stored) {
		t.Fatalf("%d acks for %d stored messages", acked.Load(), stored)
	}
	if rec, err := s.Get(t.Context(), "loyalty", "m-0"); err != nil || rec.Status != inbox.StatusSucceeded {
		t.Fatalf("record of m-0: %+v, %v", rec, err)
	}
}

// TestConsumerConnectionClosed: when the client gives up reconnecting
// (its MaxReconnects ran out), the connection is closed for good and
// JetStream's Consume stops; Run returns an error saying so instead of
// waiting, consuming nothing, for its context to end.
func TestConsumerConnectionClosed(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	proxy, nc, js := viaProxy(t, nats.MaxReconnects(2), nats.ReconnectWait(50*time.Millisecond))
	db, _, in := sqliteInbox(t, inbox.Config{})
	ce := e
	ce.js = js
	var rec recorder
	c := newConsumer(t, ce, natsjs.HandleTx(in, db, effect(sqlstore.SQLite, "p")), natsjs.Config{Observe: rec.observe})
	r := start(t, c)
	e.publish(t, "x", "before", "{}")
	obstest.WaitFor(t, "the first message", func() bool { return rec.count("before") == 1 })
	proxy.Refuse(true)
	proxy.Drop()
	obstest.WaitFor(t, "the connection to close", nc.IsClosed)
	select {
	case <-r.done:
		if !errors.Is(r.err, nats.ErrConnectionClosed) {
			t.Fatalf("Run returned %v, want an error wrapping nats.ErrConnectionClosed", r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run still runs on a closed connection, consuming nothing")
	}
}

// TestConsumerRecreated: the durable is deleted while the consumer runs
// (an operator's mistake, a server that lost it). JetStream's Consume
// stops on the server's "consumer deleted"; the Consumer creates the
// durable again and consumes on: the messages published after are
// handled, and those the new durable delivers again are duplicates.
func TestConsumerRecreated(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	db, _, in := sqliteInbox(t, inbox.Config{})
	var rec recorder
	c := newConsumer(t, e, natsjs.HandleTx(in, db, effect(sqlstore.SQLite, "p")), natsjs.Config{Observe: rec.observe})
	r := start(t, c)
	e.publish(t, "x", "first", "{}")
	obstest.WaitFor(t, "the first message", func() bool { return rec.count("first") == 1 && settled(t, c) })
	if err := e.js.DeleteConsumer(t.Context(), e.stream, "loyalty"); err != nil {
		t.Fatal(err)
	}
	e.publish(t, "x", "second", "{}")
	obstest.WaitFor(t, "the second message", func() bool { return rec.count("second") == 1 })
	obstest.WaitFor(t, "the durable to settle", func() bool { return drained(t, c) })
	r.stillRunning(t, "after the durable was deleted")
	if all, _ := effects(t, db, sqlstore.SQLite, ""); all != 2 {
		t.Fatalf("%d effects, want 2", all)
	}
	if got := fmt.Sprint(rec.of("first")); got != "[processed/acked@1 duplicate/acked@1]" {
		t.Fatalf("events of the first message %s", got)
	}
}

// TestConsumerRecreatedAfterOutage: the durable is deleted while the
// consumer's connection is down. After the reconnect, JetStream's pulls
// go to a consumer that does not exist, and nothing answers them but
// "no responders"; Consume would pull on forever. When its heartbeats
// are missed (after 30 s, twice the default pull's heartbeat), the
// Consumer finds the durable gone, creates it again and consumes on.
func TestConsumerRecreatedAfterOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the pull's missed heartbeats (30 s)")
	}
	t.Parallel()
	e := setup(t, 0)
	proxy, nc, js := viaProxy(t, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	db, _, in := sqliteInbox(t, inbox.Config{})
	ce := e
	ce.js = js
	var rec recorder
	c := newConsumer(t, ce, natsjs.HandleTx(in, db, effect(sqlstore.SQLite, "p")), natsjs.Config{Observe: rec.observe})
	r := start(t, c)
	e.publish(t, "x", "first", "{}")
	obstest.WaitFor(t, "the first message", func() bool { return rec.count("first") == 1 && settled(t, c) })
	proxy.Refuse(true)
	proxy.Drop()
	obstest.WaitFor(t, "the cut to be noticed", func() bool { return !nc.IsConnected() })
	if err := e.js.DeleteConsumer(t.Context(), e.stream, "loyalty"); err != nil {
		t.Fatal(err)
	}
	e.publish(t, "x", "second", "{}")
	proxy.Refuse(false)
	obstest.WaitFor(t, "the second message", func() bool { return rec.count("second") == 1 })
	obstest.WaitFor(t, "the durable to settle", func() bool { return drained(t, c) })
	r.stillRunning(t, "after the durable was deleted")
	if all, _ := effects(t, db, sqlstore.SQLite, ""); all != 2 {
		t.Fatalf("%d effects, want 2", all)
	}
	if got := fmt.Sprint(rec.of("first")); got != "[processed/acked@1 duplicate/acked@1]" {
		t.Fatalf("events of the first message %s", got)
	}
}
