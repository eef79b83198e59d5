package natsjsembed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/natsjs"
)

// embedded starts a NATS server with JetStream in the test process, as
// shopd starts its own (loopback, a free port), storing in a temporary
// directory, and returns a connection to it. Both end with the test.
func embedded(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	ns, err := server.NewServer(&server.Options{
		ServerName: "natsjsembed",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   t.TempDir(),
		NoSigs:     true,
		NoLog:      true,
	})
	if err != nil {
		t.Fatalf("embedded NATS: %v", err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(30 * time.Second) {
		t.Fatal("embedded NATS: not ready after 30s")
	}
	nc, err := nats.Connect(ns.ClientURL(), nats.Name(t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

const (
	stream     = "ORDERS"
	deadStream = "ORDERS_DEAD"
	durable    = "payments"
)

// streams creates the stream of "orders.>" (Duplicates window window)
// and the dead-letter stream of the consumer's default dead-letter
// subject.
func streams(t *testing.T, js jetstream.JetStream, window time.Duration) {
	t.Helper()
	for _, sc := range []jetstream.StreamConfig{
		{Name: stream, Subjects: []string{"orders.>"}, Duplicates: window, Storage: jetstream.FileStorage},
		{Name: deadStream, Subjects: []string{natsjs.DefaultDeadLetterPrefix + stream + ".>"}, Storage: jetstream.FileStorage},
	} {
		if _, err := js.CreateStream(t.Context(), sc); err != nil {
			t.Fatalf("create stream %s: %v", sc.Name, err)
		}
	}
}

func publish(t *testing.T, js jetstream.JetStream, id, payload string) *jetstream.PubAck {
	t.Helper()
	m := nats.NewMsg("orders.paid")
	m.Data = []byte(payload)
	ack, err := js.PublishMsg(t.Context(), m, jetstream.WithMsgID(id))
	if err != nil {
		t.Fatalf("publish %s: %v", id, err)
	}
	return ack
}

// recorder keeps the consumer's events, as "result/action@delivery" by
// message ID.
type recorder struct {
	mu  sync.Mutex
	evs map[string][]string
}

func (r *recorder) observe(ev natsjs.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.evs == nil {
		r.evs = map[string][]string{}
	}
	r.evs[ev.Message.ID] = append(r.evs[ev.Message.ID], fmt.Sprintf("%s/%s@%d", ev.Outcome.Result, ev.Action, ev.Delivered))
}

func (r *recorder) of(id string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprint(r.evs[id])
}

func (r *recorder) count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.evs[id])
}

// consume runs a natsjs Consumer (the inbox's Handle over a memory store)
// until the test ends.
func consume(t *testing.T, js jetstream.JetStream, in *inbox.Inbox, h inbox.Handler, cfg natsjs.Config) *natsjs.Consumer {
	t.Helper()
	cfg.Stream, cfg.Durable = stream, durable
	c, err := natsjs.NewConsumer(t.Context(), js, natsjs.Handle(in, h), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return c
}

// settled: nothing left to deliver, nothing awaiting an ack, nothing
// being redelivered.
func settled(t *testing.T, c *natsjs.Consumer) bool {
	t.Helper()
	info, err := c.JetStreamConsumer().Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.NumPending == 0 && info.NumAckPending == 0 && info.NumRedelivered == 0
}

func newInbox(t *testing.T, cfg inbox.Config) (*inbox.MemoryStore, *inbox.Inbox) {
	t.Helper()
	s := inbox.NewMemoryStore()
	cfg.Group = durable
	cfg.Backoff = func(int) time.Duration { return 20 * time.Millisecond }
	in, err := inbox.New(s, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, in
}

// terminated is the server's advisory of a terminated message.
type terminated struct {
	Type       string `json:"type"`
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
	Reason     string `json:"reason"`
}

// On a server from 2.10.4 a poison message is dead-lettered and then
// terminated with TermWithReason: the server's MSG_TERMINATED advisory
// carries the inbox's reason, and the message is not redelivered.
func TestPoisonTerminatedWithReason(t *testing.T) {
	t.Parallel()
	nc, js := embedded(t)
	var v [3]int
	if _, err := fmt.Sscanf(nc.ConnectedServerVersion(), "%d.%d.%d", &v[0], &v[1], &v[2]); err != nil || v[0]*1e6+v[1]*1e3+v[2] < 2_010_004 {
		t.Fatalf("embedded server %q: this test needs one that honours TermWithReason (2.10.4 and later)", nc.ConnectedServerVersion())
	}
	streams(t, js, 0)
	advisories, err := nc.SubscribeSync("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED." + stream + "." + durable)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	s, in := newInbox(t, inbox.Config{MaxAttempts: 3})
	var effects sync.Map
	h := func(_ context.Context, d inbox.Delivery) error {
		if string(d.Payload) == "garbage" {
			return errors.New("cannot decode the payload")
		}
		n, _ := effects.LoadOrStore(d.ID, new(int))
		*n.(*int)++
		return nil
	}
	var rec recorder
	c := consume(t, js, in, h, natsjs.Config{Observe: rec.observe, Workers: 2})
	for i := range 6 {
		if i == 2 {
			publish(t, js, "poison", "garbage")
		}
		publish(t, js, fmt.Sprint("ok-", i), "{}")
	}
	obstest.WaitFor(t, "every message settled", func() bool {
		for i := range 6 {
			if rec.count(fmt.Sprint("ok-", i)) != 1 {
				return false
			}
		}
		return rec.count("poison") == 3 && settled(t, c)
	})
	if got, want := rec.of("poison"), "[retry/naked@1 retry/naked@2 dead/dead-lettered@3]"; got != want {
		t.Fatalf("poison events %s, want %s", got, want)
	}
	for i := range 6 {
		id := fmt.Sprint("ok-", i)
		n, ok := effects.Load(id)
		if !ok || *n.(*int) != 1 {
			t.Fatalf("%s: effects %v", id, n)
		}
	}
	if r, err := s.Get(t.Context(), durable, "poison"); err != nil || r.Status != inbox.StatusDead || r.Attempts != 3 {
		t.Fatalf("record %+v, %v", r, err)
	}

	msg, err := advisories.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no MSG_TERMINATED advisory: %v", err)
	}
	var adv terminated
	if err := json.Unmarshal(msg.Data, &adv); err != nil {
		t.Fatalf("advisory %s: %v", msg.Data, err)
	}
	if adv.Type != "io.nats.jetstream.advisory.v1.terminated" || adv.Stream != stream || adv.Consumer != durable ||
		adv.StreamSeq != 3 || adv.Deliveries != 3 || adv.Reason != "cannot decode the payload" {
		t.Fatalf("advisory %+v (%s), want poison's (stream sequence 3, 3 deliveries) with the inbox's reason", adv, msg.Data)
	}
	if extra, err := advisories.NextMsg(200 * time.Millisecond); err == nil {
		t.Fatalf("a second termination: %s", extra.Data)
	}

	// The dead letter is in its stream, with the same reason.
	ds, err := js.Stream(t.Context(), deadStream)
	if err != nil {
		t.Fatal(err)
	}
	dl, err := ds.GetLastMsgForSubject(t.Context(), natsjs.DefaultDeadLetterPrefix+stream+"."+durable)
	if err != nil {
		t.Fatalf("dead letter: %v", err)
	}
	if string(dl.Data) != "garbage" || dl.Header.Get(natsjs.DeadIDHeader) != "poison" || dl.Header.Get(natsjs.DeadReasonHeader) != "cannot decode the payload" {
		t.Fatalf("dead letter %q %v", dl.Data, dl.Header)
	}
	if info, err := ds.Info(t.Context()); err != nil || info.State.Msgs != 1 {
		t.Fatalf("dead-letter stream %+v, %v; want 1 message", info, err)
	}
}

// Duplicates and redeliveries on the embedded server: a message published
// 5 times within the stream's Duplicates window is held once; published
// again past it, it is held twice and the inbox acks the second as a
// duplicate; a message whose first attempt fails is redelivered and
// handled once. Each effect happens once.
func TestDuplicatesAndRedelivery(t *testing.T) {
	t.Parallel()
	_, js := embedded(t)
	// Five publishes must fall inside the window on a loaded machine:
	// 100 ms was missed once under CI's load.
	const window = 3 * time.Second
	streams(t, js, window)
	s, in := newInbox(t, inbox.Config{})
	var mu sync.Mutex
	effects, calls := map[string]int{}, map[string]int{}
	h := func(_ context.Context, d inbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		calls[d.ID]++
		if d.ID == "flaky" && calls[d.ID] == 1 {
			return errors.New("downstream unavailable")
		}
		effects[d.ID]++
		return nil
	}
	var rec recorder
	c := consume(t, js, in, h, natsjs.Config{Observe: rec.observe})
	dups := 0
	for range 5 {
		if publish(t, js, "twice", "{}").Duplicate {
			dups++
		}
	}
	if dups != 4 {
		t.Fatalf("%d of 5 publishes within the window were duplicates, want 4", dups)
	}
	publish(t, js, "flaky", "{}")
	obstest.WaitFor(t, "the first deliveries", func() bool { return rec.count("twice") == 1 && rec.count("flaky") == 2 })
	for publish(t, js, "twice", "{}").Duplicate { // past the window: held again
		time.Sleep(window / 4)
	}
	obstest.WaitFor(t, "every delivery", func() bool { return rec.count("twice") == 2 && settled(t, c) })
	if got, want := rec.of("twice"), "[processed/acked@1 duplicate/acked@1]"; got != want {
		t.Fatalf("events of twice %s, want %s", got, want)
	}
	if got, want := rec.of("flaky"), "[retry/naked@1 processed/acked@2]"; got != want {
		t.Fatalf("events of flaky %s, want %s", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if effects["twice"] != 1 || effects["flaky"] != 1 || calls["twice"] != 1 || calls["flaky"] != 2 {
		t.Fatalf("effects %v, calls %v", effects, calls)
	}
	for _, id := range []string{"twice", "flaky"} {
		if r, err := s.Get(t.Context(), durable, id); err != nil || r.Status != inbox.StatusSucceeded {
			t.Fatalf("record of %s %+v, %v", id, r, err)
		}
	}
}
