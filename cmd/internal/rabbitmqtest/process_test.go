package rabbitmqtest

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/rabbitmq"
	"github.com/idemkit/idem/sqlstore"
)

// Environment of the child processes.
const (
	envMode    = "RABBITMQ_TEST_MODE" // "hang", "stream" or "relay-crash"
	envURL     = "RABBITMQ_TEST_URL"
	envQueue   = "RABBITMQ_TEST_QUEUE"
	envDialect = "RABBITMQ_TEST_DIALECT"
	envAddr    = "RABBITMQ_TEST_ADDR"
)

// TestChild is the body of the child processes the tests below start.
func TestChild(t *testing.T) {
	mode := os.Getenv(envMode)
	if mode == "" {
		t.Skip("a child process of the process tests")
	}
	url, queue := os.Getenv(envURL), os.Getenv(envQueue)
	switch mode {
	case "hang", "stream":
		st := openStore(t, os.Getenv(envDialect), os.Getenv(envAddr))
		in := st.inbox(t, inbox.Config{})
		handle := rabbitmq.HandleTx(in, st.db, st.effect(fmt.Sprint(os.Getpid())))
		var out sync.Mutex
		h := func(ctx context.Context, m inbox.Message) (inbox.Outcome, error) {
			o, err := handle(ctx, m)
			out.Lock()
			fmt.Printf("%s %s %v\n", o.Result, m.ID, err)
			out.Unlock()
			if mode == "hang" && o.Result == inbox.Processed {
				select {} // committed, never acked: killed here
			}
			return o, err
		}
		cfg := rabbitmq.ConsumerConfig{URL: url, Queue: queue, Workers: 8, Prefetch: 64}
		if mode == "hang" {
			cfg.Workers = 1
		}
		c, err := rabbitmq.NewConsumer(&cfg, h)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }() // stdin closed: stop
		if err := c.Run(ctx); err != nil {
			t.Fatal(err)
		}
	case "relay-crash":
		db, err := sql.Open("pgx", os.Getenv(envAddr))
		if err != nil {
			t.Fatal(err)
		}
		s, err := sqlstore.NewOutboxStore(db, &sqlstore.OutboxConfig{Dialect: sqlstore.PostgreSQL})
		if err != nil {
			t.Fatal(err)
		}
		p, err := rabbitmq.NewPublisher(&rabbitmq.PublisherConfig{URL: url})
		if err != nil {
			t.Fatal(err)
		}
		crash := outbox.PublisherFunc(func(ctx context.Context, m outbox.Message) error {
			if err := p.Publish(ctx, m); err != nil {
				return err
			}
			fmt.Println("confirmed", m.ID)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL) // before the mark
			select {}
		})
		r, err := outbox.NewRelay(s, crash, &outbox.RelayConfig{PollInterval: 20 * time.Millisecond, Retention: -1})
		if err != nil {
			t.Fatal(err)
		}
		_ = r.Run(context.Background())
	}
}

func child(t *testing.T, mode string, b *broker, st *store) (*exec.Cmd, io.WriteCloser, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.count=1", "-test.v=false")
	cmd.Env = append(os.Environ(), envMode+"="+mode, envURL+"="+b.url, envQueue+"="+b.queue,
		envDialect+"="+st.dialect.String(), envAddr+"="+st.addr)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, in, bufio.NewScanner(out)
}

func wantKilled(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	err := cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want killed", err)
	}
}

// A consumer process is killed (SIGKILL) after HandleTx committed the
// effect and before the ack: the broker redelivers the message (with the
// redelivered flag), the next consumer's inbox answers Duplicate, and the
// effect happened once. PostgreSQL.
func TestConsumerKilledBeforeAck(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a process")
	}
	t.Parallel()
	b := newBroker(t, nil)
	st := postgresStore(t)
	b.publish(t, "order-3.paid", "x")
	cmd, _, out := child(t, "hang", b, st)
	if !out.Scan() || out.Text() != "processed order-3.paid <nil>" {
		t.Fatalf("child said %q, want the commit", out.Text())
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	wantKilled(t, cmd)
	if n := st.effectsOf(t, "order-3.paid"); n != 1 {
		t.Fatalf("%d effects after the kill, want 1", n)
	}
	var s seen
	in := st.inbox(t, inbox.Config{})
	run(t, b.consumerConfig(), s.wrap(rabbitmq.HandleTx(in, st.db, st.effect("p"))))
	eventually(t, 30*time.Second, "the redelivery", func() bool { return len(s.all()) == 1 })
	if got := s.all()[0]; got.result != inbox.Duplicate || got.redelivered != "true" {
		t.Fatalf("redelivery %+v, want a duplicate flagged redelivered", got)
	}
	if n := st.effectsOf(t, "order-3.paid"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	eventually(t, 10*time.Second, "the queue to be empty", func() bool { n, _ := b.depth(t, b.queue); return n == 0 })
}

// Two consumer processes (8 workers each) on one queue and one group:
// 10,000 messages of which 10 % are duplicates (9,000 distinct IDs, 1,000
// re-publishes at random places) give exactly 9,000 effects, one per ID.
// PostgreSQL.
func TestConsumerTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Parallel()
	const distinct, dups = 9000, 1000
	b := newBroker(t, nil)
	st := postgresStore(t)
	ids := make([]string, 0, distinct+dups)
	for i := range distinct {
		ids = append(ids, fmt.Sprint("m-", i))
	}
	for range dups {
		ids = append(ids, ids[rand.IntN(distinct)])
	}
	rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })

	var handled atomic.Int64
	results := make([]map[string]int, 2)
	var stdins []io.WriteCloser
	var cmds []*exec.Cmd
	var wg sync.WaitGroup
	for i := range 2 {
		cmd, in, out := child(t, "stream", b, st)
		cmds, stdins = append(cmds, cmd), append(stdins, in)
		results[i] = map[string]int{}
		wg.Go(func() {
			for out.Scan() {
				f := strings.Fields(out.Text())
				if len(f) != 3 { // the child's test framework
					continue
				}
				results[i][f[0]]++
				handled.Add(1)
			}
		})
	}
	for _, id := range ids {
		b.publish(t, id, "x")
	}
	eventually(t, 3*time.Minute, "every message handled", func() bool { return handled.Load() >= int64(len(ids)) })
	for _, in := range stdins {
		_ = in.Close()
	}
	wg.Wait()
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
	}
	rows, d := st.effects(t)
	if rows != distinct || d != distinct {
		t.Fatalf("%d effects, %d distinct; want %d", rows, d, distinct)
	}
	if n, _ := b.depth(t, b.queue); n != 0 {
		t.Fatalf("%d messages left in the queue (not acked)", n)
	}
	processed := results[0]["processed"] + results[1]["processed"]
	if processed != distinct || results[0]["processed"] == 0 || results[1]["processed"] == 0 {
		t.Fatalf("processed per process %v / %v, want %d in all, both taking part", results[0], results[1], distinct)
	}
	var perProcess [2]int
	if err := st.db.QueryRow(`SELECT COUNT(DISTINCT process), MIN(n) FROM (SELECT process, COUNT(*) AS n FROM effects GROUP BY process) p`).Scan(&perProcess[0], &perProcess[1]); err != nil {
		t.Fatal(err)
	}
	if perProcess[0] != 2 {
		t.Fatalf("effects written by %d processes, want 2", perProcess[0])
	}
	t.Logf("process 0: %v; process 1: %v", results[0], results[1])
}

// A relay process is killed (SIGKILL) after the broker confirmed a
// message and before the relay marked it sent: the next relay publishes
// it again with the same message_id, and the consumer's inbox handles it
// once. PostgreSQL.
func TestRelayKilledBetweenPublishAndMark(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a process")
	}
	t.Parallel()
	b := newBroker(t, nil)
	db, addr := testdb.Postgres(t)
	db.SetMaxOpenConns(4)
	ob, err := sqlstore.NewOutboxStore(db, &sqlstore.OutboxConfig{Dialect: sqlstore.PostgreSQL})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	st := setupStore(t, db, addr, sqlstore.PostgreSQL)
	tx, err := db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := ob.Add(t.Context(), tx, outbox.Message{Topic: b.queue, Key: "order-4", Payload: []byte("paid")})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	cmd, _, out := child(t, "relay-crash", b, st)
	if !out.Scan() || out.Text() != "confirmed "+id {
		t.Fatalf("child said %q, want the confirm of %s", out.Text(), id)
	}
	wantKilled(t, cmd)
	if n, _ := b.depth(t, b.queue); n != 1 {
		t.Fatalf("%d messages in the queue after the kill, want 1", n)
	}

	p, err := rabbitmq.NewPublisher(&rabbitmq.PublisherConfig{URL: b.url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	r, err := outbox.NewRelay(ob, p, &outbox.RelayConfig{Retention: -1})
	if err != nil {
		t.Fatal(err)
	}
	// The killed relay's claim is a transaction holding the row (FOR
	// UPDATE SKIP LOCKED) until PostgreSQL sees its connection close: a
	// relay polling right after the kill may skip the row once.
	sent := 0
	eventually(t, 30*time.Second, "the next relay to send the message again", func() bool {
		n, err := r.Once(t.Context())
		if err != nil {
			t.Fatalf("the next relay: %v", err)
		}
		sent += n
		return sent > 0
	})
	if sent != 1 {
		t.Fatalf("the next relay sent %d, want the message once", sent)
	}
	var pending int
	if err := db.QueryRow(`SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL`).Scan(&pending); err != nil || pending != 0 {
		t.Fatalf("%d pending, %v", pending, err)
	}

	var s seen
	in := st.inbox(t, inbox.Config{})
	run(t, b.consumerConfig(), s.wrap(rabbitmq.HandleTx(in, st.db, st.effect("p"))))
	eventually(t, 30*time.Second, "both copies", func() bool { return len(s.all()) == 2 })
	got := s.all()
	if got[0].id != id || got[1].id != id || got[0].result != inbox.Processed || got[1].result != inbox.Duplicate {
		t.Fatalf("deliveries %+v, want %s processed and then a duplicate", got, id)
	}
	if n := st.effectsOf(t, id); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
}
