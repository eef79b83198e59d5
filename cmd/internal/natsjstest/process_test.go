package natsjstest

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/natsjs"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

// Environment of the child processes.
const (
	envMode    = "NATSJS_TEST_MODE" // "kill", "stream" or "relay"
	envStream  = "NATSJS_TEST_STREAM"
	envSubject = "NATSJS_TEST_SUBJECT"
	envDB      = "NATSJS_TEST_DB"
	envName    = "NATSJS_TEST_NAME"
)

// child starts the test binary running test in mode, with env added, and
// returns it with its stdout; its stdin is a pipe whose closing asks it
// to stop.
func child(t *testing.T, test, mode string, env ...string) (*exec.Cmd, *bufio.Scanner, io.WriteCloser) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), envMode+"="+mode), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, bufio.NewScanner(out), in
}

// childEnv is the env of a child process: the stream its parent made.
func childEnv(t *testing.T) env {
	nc, js := connect(t)
	st := os.Getenv(envStream)
	return env{nc: nc, js: js, stream: st, subject: os.Getenv(envSubject), dead: st + "_DEAD"}
}

// waitLine reads sc until a line starting with prefix, and returns the
// rest of it.
func waitLine(t *testing.T, sc *bufio.Scanner, prefix string) string {
	t.Helper()
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			return rest
		}
	}
	t.Fatalf("the child ended before printing %q", prefix)
	return ""
}

// TestConsumerKilledBeforeAck: a consumer process commits a message's
// effect and is killed with SIGKILL before it acks. The server
// redelivers the message after AckWait; the next consumer finds it
// succeeded, acks it as a duplicate, and the effect happened once.
func TestConsumerKilledBeforeAck(t *testing.T) {
	if os.Getenv(envMode) == "kill" {
		killChild(t)
		return
	}
	if testing.Short() {
		t.Skip("spawns a process")
	}
	t.Parallel()
	e := setup(t, 0)
	path := filepath.Join(t.TempDir(), "inbox.db")
	cmd, sc, _ := child(t, "TestConsumerKilledBeforeAck", "kill", envStream+"="+e.stream, envSubject+"="+e.subject, envDB+"="+path)
	e.publish(t, "order.paid", "order-5.paid", "{}")
	if id := waitLine(t, sc, "committed "); id != "order-5.paid" {
		t.Fatalf("the child committed %q", id)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	db, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if all, of := effects(t, db, sqlstore.SQLite, "order-5.paid"); all != 1 || of != 1 {
		t.Fatalf("%d effects after the kill, want 1 (committed)", all)
	}
	s, in := inboxOn(t, db, sqlstore.SQLite, inbox.Config{})
	var rec recorder
	c := newConsumer(t, e, natsjs.HandleTx(in, db, effect(sqlstore.SQLite, "parent")), natsjs.Config{Observe: rec.observe, AckWait: time.Second})
	run(t, c)
	obstest.WaitFor(t, "the redelivery", func() bool { return rec.count("order-5.paid") >= 1 && settled(t, c) })
	// Each delivery the next consumer gets is acked as a duplicate. On a
	// quiet machine there is one (delivered twice in all); a CI machine at
	// a load of 19 once showed two, with delivery counts 3 and 1, an ack
	// having missed the 1 s AckWait: more deliveries are the broker's
	// right, a second effect never is (checked below).
	for _, ev := range rec.of("order-5.paid") {
		if !strings.HasPrefix(ev, "duplicate/acked@") {
			t.Fatalf("events %v, want every redelivery acked as a duplicate", rec.of("order-5.paid"))
		}
	}
	if all, of := effects(t, db, sqlstore.SQLite, "order-5.paid"); all != 1 || of != 1 {
		t.Fatalf("%d effects, want 1", all)
	}
	if r, err := s.Get(t.Context(), "loyalty", "order-5.paid"); err != nil || r.Status != inbox.StatusSucceeded || r.Attempts != 1 {
		t.Fatalf("record %+v, %v", r, err)
	}
}

func killChild(t *testing.T) {
	e := childEnv(t)
	db, err := sqlite.Open(t.Context(), os.Getenv(envDB))
	if err != nil {
		t.Fatal(err)
	}
	_, in := inboxOn(t, db, sqlstore.SQLite, inbox.Config{})
	process := natsjs.HandleTx(in, db, effect(sqlstore.SQLite, "child"))
	c := newConsumer(t, e, func(ctx context.Context, m inbox.Message) (inbox.Outcome, error) {
		o, err := process(ctx, m)
		if o.Result == inbox.Processed {
			fmt.Printf("committed %s\n", m.ID)
			select {} // killed here: committed, not acked
		}
		return o, err
	}, natsjs.Config{AckWait: time.Second})
	_ = c.Run(t.Context())
}

// TestTwoConsumerProcesses: two processes × 8 workers on one durable
// consumer, a stream of 10,000 messages of which 10 % are duplicates
// (9,000 distinct IDs; the 1,000 re-publishes land in the stream past its
// 100 ms Duplicates window, interleaved with new messages while the
// consumers run). Exactly the distinct messages' effects: 9,000 rows, one
// per ID, on PostgreSQL.
func TestTwoConsumerProcesses(t *testing.T) {
	if os.Getenv(envMode) == "stream" {
		streamChild(t)
		return
	}
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Parallel()
	e := setup(t, minWindow)
	db, addr := testdb.Postgres(t)
	db.SetMaxOpenConns(4)
	inboxOn(t, db, sqlstore.PostgreSQL, inbox.Config{})
	// The durable exists before the children start, so that none of the
	// messages is missed.
	probe := newConsumer(t, e, func(context.Context, inbox.Message) (inbox.Outcome, error) { return inbox.Outcome{}, nil }, natsjs.Config{})
	var stdins []io.WriteCloser
	var cmds []*exec.Cmd
	for i := range 2 {
		cmd, sc, in := child(t, "TestTwoConsumerProcesses", "stream", envStream+"="+e.stream, envSubject+"="+e.subject, envDB+"="+addr, envName+"="+fmt.Sprint("p", i))
		waitLine(t, sc, "consuming")
		go func() {
			for sc.Scan() {
			}
		}()
		stdins, cmds = append(stdins, in), append(cmds, cmd)
	}
	const rounds, fresh, dups = 10, 900, 100
	var ids []string
	rnd := rand.New(rand.NewPCG(1, 2))
	for r := range rounds {
		for i := range fresh {
			id := fmt.Sprintf("m-%d-%d", r, i)
			ids = append(ids, id)
			e.publish(t, "order.paid", id, id)
		}
		time.Sleep(minWindow + minWindow/2)
		for range dups {
			id := ids[rnd.IntN(len(ids))]
			e.publishAgain(t, "order.paid", id, id)
		}
	}
	if n := e.streamMsgs(t, e.stream); n != rounds*(fresh+dups) {
		t.Fatalf("the stream holds %d messages, want %d", n, rounds*(fresh+dups))
	}
	obstest.WaitFor(t, "the consumers", func() bool {
		all, _ := effects(t, db, sqlstore.PostgreSQL, "")
		return all >= rounds*fresh && settled(t, probe)
	})
	for i, in := range stdins {
		_ = in.Close()
		if err := cmds[i].Wait(); err != nil {
			t.Errorf("child %d: %v", i, err)
		}
	}
	var rows, distinct, p0, p1, succeeded int
	if err := db.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT message_id), COUNT(*) FILTER (WHERE process = 'p0'), COUNT(*) FILTER (WHERE process = 'p1') FROM effects`).Scan(&rows, &distinct, &p0, &p1); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`SELECT COUNT(*) FROM idem_inbox WHERE status = 'succeeded'`).Scan(&succeeded); err != nil {
		t.Fatal(err)
	}
	t.Logf("effects: %d (p0 %d, p1 %d), records %d", rows, p0, p1, succeeded)
	if rows != rounds*fresh || distinct != rounds*fresh || succeeded != rounds*fresh {
		t.Fatalf("%d effect rows, %d distinct, %d records; want %d", rows, distinct, succeeded, rounds*fresh)
	}
	if p0 == 0 || p1 == 0 {
		t.Fatalf("one process did nothing: p0 %d, p1 %d", p0, p1)
	}
}

func streamChild(t *testing.T) {
	e := childEnv(t)
	db, err := sql.Open("pgx", os.Getenv(envDB))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { _ = db.Close() })
	_, in := inboxOn(t, db, sqlstore.PostgreSQL, inbox.Config{})
	c := newConsumer(t, e, natsjs.HandleTx(in, db, effect(sqlstore.PostgreSQL, os.Getenv(envName))), natsjs.Config{Workers: 8, Prefetch: 64})
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin) // the parent closes it: stop
		cancel()
	}()
	fmt.Println("consuming")
	if err := c.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRelayKilledBeforeMark: a relay process publishes an outbox message
// (the stream confirms it) and is killed before it marks the message
// sent. The next relay publishes it again, with the same ID: within the
// stream's Duplicates window the stream drops it; past it, the stream
// holds it twice and the consumer's inbox acks the second as a
// duplicate. Either way it is consumed once.
func TestRelayKilledBeforeMark(t *testing.T) {
	if os.Getenv(envMode) == "relay" {
		relayChild(t)
		return
	}
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Parallel()
	for _, tc := range []struct {
		name       string
		window     time.Duration
		wantStored uint64
		want       string
	}{
		{"within the window", 0, 1, "[processed/acked@1]"},
		{"past the window", minWindow, 2, "[processed/acked@1 duplicate/acked@1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, tc.window)
			path := filepath.Join(t.TempDir(), "shop.db")
			db, ob := outboxOn(t, path)
			tx, err := db.BeginTx(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			id, err := ob.Add(t.Context(), tx, outbox.Message{Topic: e.subject + ".order.paid", Key: "order-8", Payload: []byte(`{"amount_cents":500}`)})
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			cmd, sc, _ := child(t, "TestRelayKilledBeforeMark", "relay", envStream+"="+e.stream, envSubject+"="+e.subject, envDB+"="+path)
			if got := waitLine(t, sc, "published "); got != id {
				t.Fatalf("the child published %q, want %q", got, id)
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			if tc.window > 0 {
				time.Sleep(tc.window + tc.window/2)
			}

			pub, err := natsjs.NewPublisher(e.js, &natsjs.PublisherConfig{Stream: e.stream})
			if err != nil {
				t.Fatal(err)
			}
			var published atomic.Int32
			relay, err := outbox.NewRelay(ob, outbox.PublisherFunc(func(ctx context.Context, m outbox.Message) error {
				published.Add(1)
				return pub.Publish(ctx, m)
			}), &outbox.RelayConfig{Retention: -1})
			if err != nil {
				t.Fatal(err)
			}
			// The dead relay's SQLite lease (1 s) must end first.
			obstest.WaitFor(t, "the republish", func() bool {
				n, err := relay.Once(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				return n == 1
			})
			if published.Load() != 1 {
				t.Fatalf("%d publishes by the second relay, want 1", published.Load())
			}
			if got := e.streamMsgs(t, e.stream); got != tc.wantStored {
				t.Fatalf("stream holds %d messages, want %d", got, tc.wantStored)
			}

			idb, _, in := sqliteInbox(t, inbox.Config{})
			var rec recorder
			c := newConsumer(t, e, natsjs.HandleTx(in, idb, effect(sqlstore.SQLite, "p")), natsjs.Config{Observe: rec.observe})
			run(t, c)
			obstest.WaitFor(t, "the deliveries", func() bool { return rec.count(id) == int(tc.wantStored) && settled(t, c) })
			if got := fmt.Sprint(rec.of(id)); got != tc.want {
				t.Fatalf("events %s, want %s", got, tc.want)
			}
			if all, of := effects(t, idb, sqlstore.SQLite, id); all != 1 || of != 1 {
				t.Fatalf("%d effects, want 1", all)
			}
		})
	}
}

// outboxOn opens the SQLite database at path with a migrated
// OutboxStore whose lease is 1 s.
func outboxOn(t testing.TB, path string) (*sql.DB, *sqlstore.OutboxStore) {
	t.Helper()
	db, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ob, err := sqlstore.NewOutboxStore(db, &sqlstore.OutboxConfig{Dialect: sqlstore.SQLite, Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ob.Close() })
	return db, ob
}

func relayChild(t *testing.T) {
	e := childEnv(t)
	_, ob := outboxOn(t, os.Getenv(envDB))
	pub, err := natsjs.NewPublisher(e.js, &natsjs.PublisherConfig{Stream: e.stream})
	if err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(ob, outbox.PublisherFunc(func(ctx context.Context, m outbox.Message) error {
		if err := pub.Publish(ctx, m); err != nil {
			return err
		}
		fmt.Printf("published %s\n", m.ID)
		select {} // killed here: confirmed by the stream, not marked sent
	}), &outbox.RelayConfig{Retention: -1})
	if err != nil {
		t.Fatal(err)
	}
	_ = relay.Run(t.Context())
}
