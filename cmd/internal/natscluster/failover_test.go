package natscluster

import (
	"context"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // "pgx" for testdb.Postgres
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/cmd/internal/outboxload"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/natsjs"
)

// TestNodeKilledUnderLoad: business transactions commit events into the
// outbox every 10 ms; a relay publishes them into a stream of three
// replicas and an inbox consumer (HandleTx) writes one effect row per
// message. Mid-load a node is killed (SIGKILL) — the stream's leader,
// the durable consumer's leader, or a follower of both — and, once
// effects flow again
// without it, started again on its store. At the end every committed
// event is in the stream, has exactly one effect row, and no delivery
// was dead-lettered or terminated. IDEM_FAILOVER_ROUNDS kills per case
// (default 1).
func TestNodeKilledUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three nats-server processes per case")
	}
	t.Parallel()
	rounds := outboxload.Rounds(t)
	for _, victim := range []string{streamLeader, consumerLeader, follower} {
		t.Run(victim, func(t *testing.T) {
			t.Parallel()
			killUnderLoad(t, victim, rounds)
		})
	}
}

// The nodes a case kills.
const (
	streamLeader   = "stream-leader"
	consumerLeader = "consumer-leader"
	follower       = "follower"
)

func killUnderLoad(t *testing.T, victimOf string, rounds int) {
	began := time.Now()
	c := startCluster(t)
	js := c.connect(t)
	stream := createStream(t, js, jetstream.StreamConfig{
		Name: "ORDERS", Subjects: []string{"orders.>"}, Replicas: 3, Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute,
	})
	dead := createStream(t, js, jetstream.StreamConfig{
		Name: "DEAD", Subjects: []string{natsjs.DefaultDeadLetterPrefix + ">"}, Replicas: 3, Storage: jetstream.FileStorage,
	})
	db, _ := testdb.Postgres(t)
	l := outboxload.New(t, db, func(int) string { return "orders.paid" })
	pub, err := natsjs.NewPublisher(js, &natsjs.PublisherConfig{Stream: "ORDERS"})
	if err != nil {
		t.Fatal(err)
	}
	l.Relay(t, pub, 200*time.Millisecond)
	cons, err := natsjs.NewConsumer(context.Background(), js, l.Handler(), &natsjs.Config{
		Stream: "ORDERS", Durable: "effects", Workers: 4, AckWait: 5 * time.Second,
		Observe: func(e natsjs.Event) {
			l.Tally.Add(e.Message.ID, e.Action, e.Outcome.Result, e.Delivered > 1, e.StoreErrors)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	outboxload.RunUntilCleanup(t, "consumer", cons.Run)
	stop := l.Produce(t, 10*time.Millisecond)
	l.WaitEffects(t, 100, time.Minute)

	for round := range rounds {
		ci := waitCurrent(t, stream)
		cc := consumerCurrent(t, cons.JetStreamConsumer())
		var name string
		switch victimOf {
		case streamLeader:
			name = ci.Leader
		case consumerLeader:
			name = cc.Leader
		case follower:
			for _, r := range ci.Replicas {
				if r.Name != cc.Leader {
					name = r.Name
				}
			}
		}
		if name == "" {
			t.Fatalf("no node leads the consumer and follows the stream: stream %+v, consumer %+v", ci, cc)
		}
		leader := name == ci.Leader || name == cc.Leader
		victim := c.node(t, name)
		before := l.Effects(t)
		killed := time.Now()
		victim.Kill(t)
		var elected time.Duration
		if leader {
			outboxload.Eventually(t, time.Minute, "leaders other than "+name, func() bool {
				ci := clusterInfo(t, stream)
				cc := consumerInfo(t, cons.JetStreamConsumer())
				return ci != nil && ci.Leader != "" && ci.Leader != name && cc != nil && cc.Leader != "" && cc.Leader != name
			})
			elected = time.Since(killed)
		}
		// More effects than the consumer buffers: messages delivered
		// after the kill.
		l.WaitEffects(t, before+100, 2*time.Minute)
		flowing := time.Since(killed)
		victim.Start(t, startTimeout)
		waitCurrent(t, stream)
		consumerCurrent(t, cons.JetStreamConsumer())
		t.Logf("round %d: killed %s (the stream's leader: %v, the consumer's: %v); a new leader after %v, 100 more effects after %v, back and current after %v",
			round+1, name, name == ci.Leader, name == cc.Leader, elected.Round(time.Millisecond), flowing.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
	}
	l.WaitEffects(t, l.Effects(t)+100, time.Minute)
	stop()
	l.Drain(t, 2*time.Minute)
	outboxload.Eventually(t, time.Minute, "the consumer settled", func() bool {
		info, err := cons.JetStreamConsumer().Info(context.Background())
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	f := l.Check(t, copies(t, stream))
	if n := len(copies(t, dead)); n != 0 {
		t.Errorf("%d dead letters", n)
	}
	t.Logf("%d kill(s) in %v: %v", rounds, time.Since(began).Round(time.Second), f)
}

// TestMemoryStreamForgetsAcked shows where JetStream's own guarantee
// stops: a stream of one replica in memory storage acknowledges a
// publish (the relay would mark it sent) and forgets it when its node is
// killed; the same stream in file storage keeps it. The outbox cannot
// help: it re-publishes only what the broker did not confirm. Use file
// storage, and three replicas to go on while a node is down.
func TestMemoryStreamForgetsAcked(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three nats-server processes")
	}
	t.Parallel()
	c := startCluster(t)
	js := c.connect(t)
	const n = 20
	for _, tc := range []struct {
		storage jetstream.StorageType
		kept    uint64
	}{{jetstream.MemoryStorage, 0}, {jetstream.FileStorage, n}} {
		name := "V" + tc.storage.String()
		s := createStream(t, js, jetstream.StreamConfig{
			Name: name, Subjects: []string{name + ".>"}, Replicas: 1, Storage: tc.storage,
		})
		for i := range n {
			m := nats.NewMsg(name + ".paid")
			m.Data = []byte("{}")
			if _, err := js.PublishMsg(context.Background(), m, jetstream.WithMsgID(name+"-"+string(rune('a'+i)))); err != nil {
				t.Fatal(err)
			}
		}
		node := c.node(t, clusterInfo(t, s).Leader)
		node.Kill(t)
		node.Start(t, startTimeout)
		var info *jetstream.StreamInfo
		outboxload.Eventually(t, startTimeout, "the stream back", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var err error
			info, err = s.Info(ctx)
			return err == nil && info.Cluster != nil && info.Cluster.Leader != ""
		})
		if info.State.Msgs != tc.kept {
			t.Errorf("%s storage: %d of %d acknowledged messages after the kill, want %d", tc.storage, info.State.Msgs, n, tc.kept)
		}
		t.Logf("%s storage, one replica: %d of %d acknowledged messages after its node was killed", tc.storage, info.State.Msgs, n)
	}
}
