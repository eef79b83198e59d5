package sqlstore_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/inbox/inboxtest"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/sqlstore"
)

// inboxSetup returns a database of the test's own, its address, and a
// migrated InboxStore on it, with the effects table of the scenarios.
func inboxSetup(t *testing.T, srv server) (*sql.DB, string, *sqlstore.InboxStore) {
	t.Helper()
	var (
		db   *sql.DB
		addr string
	)
	switch srv.dialect {
	case sqlstore.SQLite:
		addr = filepath.Join(t.TempDir(), "inbox.db")
		db = openDB(t, addr)
	case sqlstore.PostgreSQL:
		db, addr = testdb.Postgres(t)
	case sqlstore.MySQL:
		db, addr = testdb.MySQL(t)
	}
	s := newInboxStore(t, db, srv.dialect)
	effects := `CREATE TABLE IF NOT EXISTS inbox_effects (message_id TEXT NOT NULL, process TEXT NOT NULL)`
	if srv.dialect == sqlstore.MySQL {
		effects = `CREATE TABLE IF NOT EXISTS inbox_effects (message_id VARBINARY(255) NOT NULL, process VARBINARY(64) NOT NULL) ENGINE = InnoDB`
	}
	if _, err := db.Exec(effects); err != nil {
		t.Fatal(err)
	}
	return db, addr, s
}

func newInboxStore(t testing.TB, db *sql.DB, d sqlstore.Dialect) *sqlstore.InboxStore {
	t.Helper()
	s, err := sqlstore.NewInboxStore(db, &sqlstore.Config{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestInboxConformance(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, _, s := inboxSetup(t, srv)
		inboxtest.Run(t, func(*testing.T) inbox.Store { return s }, inboxtest.Caps{
			BeginTx: func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
		})
	})
}

// effect is a HandleTx handler that writes one row of inbox_effects.
func effect(srv server, process string) inbox.TxHandler {
	q := srv.rebind(`INSERT INTO inbox_effects (message_id, process) VALUES (?, ?)`)
	return func(ctx context.Context, tx *sql.Tx, d inbox.Delivery) error {
		_, err := tx.ExecContext(ctx, q, d.ID, process)
		return err
	}
}

// effects counts the rows of inbox_effects, and those of id.
func effects(t testing.TB, srv server, db *sql.DB, id string) (all, of int) {
	t.Helper()
	if err := db.QueryRow(srv.rebind(`SELECT COUNT(*), COALESCE(SUM(CASE WHEN message_id = ? THEN 1 ELSE 0 END), 0) FROM inbox_effects`), id).Scan(&all, &of); err != nil {
		t.Fatal(err)
	}
	return all, of
}

func newSQLInbox(t testing.TB, s inbox.Store, cfg inbox.Config) *inbox.Inbox {
	t.Helper()
	if cfg.Group == "" {
		cfg.Group = "loyalty"
	}
	in, err := inbox.New(s, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func wantRecord(t testing.TB, s inbox.Store, group, id string, st inbox.Status, attempts int) inbox.Record {
	t.Helper()
	r, err := s.Get(context.Background(), group, id)
	if err != nil || r.Status != st || r.Attempts != attempts {
		t.Fatalf("record %s = %+v, %v; want %s after %d attempts", id, r, err, st, attempts)
	}
	return r
}

// The same message delivered 5 times, and once more after an ack that
// was lost (HandleTx returned, the broker never heard of it): one effect.
func TestInboxHandleTxOnce(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, _, s := inboxSetup(t, srv)
		in := newSQLInbox(t, s, inbox.Config{})
		var got []inbox.Result
		for range 5 {
			o, err := in.HandleTx(t.Context(), db, inbox.Message{ID: "order-1.paid"}, effect(srv, "p"))
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, o.Result)
		}
		if want := "[processed duplicate duplicate duplicate duplicate]"; fmt.Sprint(got) != want {
			t.Fatalf("results %v, want %s", got, want)
		}
		if all, of := effects(t, srv, db, "order-1.paid"); all != 1 || of != 1 {
			t.Fatalf("%d effect rows (%d of the message), want 1", all, of)
		}
		wantRecord(t, s, "loyalty", "order-1.paid", inbox.StatusSucceeded, 1)

		// The effect committed, the ack was lost: the redelivery is a
		// duplicate, acked without a second effect.
		o, err := in.HandleTx(t.Context(), db, inbox.Message{ID: "order-2.paid"}, effect(srv, "p"))
		if err != nil || o.Result != inbox.Processed {
			t.Fatalf("first delivery %+v %v", o, err)
		}
		// (the ack is lost here)
		o, err = in.HandleTx(t.Context(), db, inbox.Message{ID: "order-2.paid"}, effect(srv, "p"))
		if err != nil || o.Result != inbox.Duplicate || !o.Result.Ack() {
			t.Fatalf("redelivery %+v %v, want a duplicate to ack", o, err)
		}
		if _, of := effects(t, srv, db, "order-2.paid"); of != 1 {
			t.Fatalf("%d effects after the lost ack, want 1", of)
		}
	})
}

// A handler that fails twice (after writing its effect, which rolls
// back) and then succeeds: the effect once, on the third delivery.
func TestInboxHandleTxFailsTwice(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, _, s := inboxSetup(t, srv)
		in := newSQLInbox(t, s, inbox.Config{})
		calls := 0
		h := func(ctx context.Context, tx *sql.Tx, d inbox.Delivery) error {
			if err := effect(srv, "p")(ctx, tx, d); err != nil {
				return err
			}
			calls++
			if calls <= 2 {
				return errors.New("points service unavailable")
			}
			return nil
		}
		for i, want := range []inbox.Result{inbox.Retry, inbox.Retry, inbox.Processed, inbox.Duplicate} {
			o, err := in.HandleTx(t.Context(), db, inbox.Message{ID: "m"}, h)
			if err != nil || o.Result != want || o.Attempt != min(i+1, 3) {
				t.Fatalf("delivery %d: %+v, %v; want %v, attempt %d", i+1, o, err, want, i+1)
			}
			wantRows := 0
			if i >= 2 {
				wantRows = 1
			}
			if _, of := effects(t, srv, db, "m"); of != wantRows {
				t.Fatalf("after delivery %d: %d effects, want %d", i+1, of, wantRows)
			}
		}
		r := wantRecord(t, s, "loyalty", "m", inbox.StatusSucceeded, 3)
		if r.LastError != "points service unavailable" {
			t.Fatalf("LastError %q", r.LastError)
		}
	})
}

// A poison message is dead after MaxAttempts; the messages around it
// keep flowing.
func TestInboxHandleTxPoison(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, _, s := inboxSetup(t, srv)
		in := newSQLInbox(t, s, inbox.Config{MaxAttempts: 3})
		h := func(ctx context.Context, tx *sql.Tx, d inbox.Delivery) error {
			if err := effect(srv, "p")(ctx, tx, d); err != nil {
				return err
			}
			if d.ID == "poison" {
				return errors.New("cannot decode")
			}
			return nil
		}
		var results []inbox.Result
		for i := range 6 {
			o, err := in.HandleTx(t.Context(), db, inbox.Message{ID: "poison"}, h)
			if err != nil {
				t.Fatal(err)
			}
			results = append(results, o.Result)
			if o, err := in.HandleTx(t.Context(), db, inbox.Message{ID: fmt.Sprint("ok-", i)}, h); err != nil || o.Result != inbox.Processed {
				t.Fatalf("ok-%d: %+v %v", i, o, err)
			}
		}
		if want := "[retry retry dead dead dead dead]"; fmt.Sprint(results) != want {
			t.Fatalf("poison: %v, want %s", results, want)
		}
		wantRecord(t, s, "loyalty", "poison", inbox.StatusDead, 3)
		if all, of := effects(t, srv, db, "poison"); all != 6 || of != 0 {
			t.Fatalf("%d effects, %d of the poison; want 6 and 0", all, of)
		}
	})
}

// Many goroutines deliver the same messages at once: one effect each.
func TestInboxHandleTxRace(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, _, s := inboxSetup(t, srv)
		in := newSQLInbox(t, s, inbox.Config{})
		const msgs, goroutines = 20, 16
		var processed atomic.Int64
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				for i := range msgs {
					id := fmt.Sprint("m-", (i+g)%msgs)
					for {
						o, err := in.HandleTx(t.Context(), db, inbox.Message{ID: id}, effect(srv, "p"))
						if err != nil {
							continue // a deadlock or a busy database: redelivered
						}
						if o.Result == inbox.Processed {
							processed.Add(1)
						}
						if o.Result.Ack() {
							break
						}
						time.Sleep(time.Millisecond)
					}
				}
			})
		}
		wg.Wait()
		var rows, distinct int
		if err := db.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT message_id) FROM inbox_effects`).Scan(&rows, &distinct); err != nil {
			t.Fatal(err)
		}
		if rows != msgs || distinct != msgs || processed.Load() != msgs {
			t.Fatalf("%d effect rows, %d distinct, %d processed; want %d", rows, distinct, processed.Load(), msgs)
		}
	})
}

// Environment of the inbox's child processes.
const (
	envInboxMode  = "SQLSTORE_TEST_INBOX_MODE" // "kill" or "stream"
	envInboxAddr  = "SQLSTORE_TEST_INBOX_ADDR"
	envInboxDial  = "SQLSTORE_TEST_INBOX_DIALECT"
	envInboxPart  = "SQLSTORE_TEST_INBOX_PART"
	envInboxStart = "SQLSTORE_TEST_INBOX_START"
)

func inboxServer(name string) server {
	for _, srv := range append([]server{sqliteServer}, servers...) {
		if srv.dialect.String() == name {
			return srv
		}
	}
	panic("no dialect " + name)
}

func inboxChildDB(t *testing.T, srv server, addr string) *sql.DB {
	if srv.dialect == sqlstore.SQLite {
		return openDB(t, addr)
	}
	db := srv.open(t, addr)
	db.SetMaxOpenConns(8)
	return db
}

// TestInboxKilledHolder: a process claims a message in Handle's mode
// (the claim commits) and is killed with SIGKILL before it finishes. The
// lease ends; the redelivery takes the message over with a higher fence
// and processes it; the dead holder's Finish, presented late with its
// fence, is refused. PostgreSQL.
func TestInboxKilledHolder(t *testing.T) {
	if os.Getenv(envInboxMode) == "kill" {
		inboxKillChild(t)
		return
	}
	if testing.Short() {
		t.Skip("spawns a process")
	}
	srv := inboxServer("postgres")
	db, addr, s := inboxSetup(t, srv)
	cmd := exec.Command(os.Args[0], "-test.run=^TestInboxKilledHolder$", "-test.count=1")
	cmd.Env = append(os.Environ(), envInboxMode+"=kill", envInboxAddr+"="+addr, envInboxDial+"=postgres")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	var oldFence int64 = -1
	for sc.Scan() {
		if f, ok := strings.CutPrefix(sc.Text(), "claimed fence "); ok {
			oldFence, _ = strconv.ParseInt(f, 10, 64)
			break
		}
	}
	if oldFence < 1 {
		_ = cmd.Process.Kill()
		t.Fatalf("the child did not claim (fence %d)", oldFence)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	wantRecord(t, s, "mailer", "order-9.paid", inbox.StatusProcessing, 1)

	in := newSQLInbox(t, s, inbox.Config{Group: "mailer", Lease: time.Second})
	var sent atomic.Int64
	deliveries := 0
	for {
		deliveries++
		o, err := in.Handle(t.Context(), inbox.Message{ID: "order-9.paid"}, func(_ context.Context, d inbox.Delivery) error {
			if d.Fence <= oldFence {
				t.Errorf("the takeover runs with fence %d, not above the dead holder's %d", d.Fence, oldFence)
			}
			sent.Add(1)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if o.Result == inbox.Processed {
			if o.Fence != oldFence+1 || o.Attempt != 2 {
				t.Fatalf("takeover %+v, want fence %d, attempt 2", o, oldFence+1)
			}
			break
		}
		if o.Result != inbox.InProgress || deliveries > 100 {
			t.Fatalf("redelivery %d: %+v", deliveries, o)
		}
		time.Sleep(min(o.Delay, 200*time.Millisecond))
	}
	if deliveries < 2 {
		t.Fatal("the first redelivery took over a live lease")
	}
	if err := s.Finish(t.Context(), "mailer", "order-9.paid", oldFence); !errors.Is(err, inbox.ErrFenced) {
		t.Fatalf("the dead holder's Finish = %v, want ErrFenced", err)
	}
	r := wantRecord(t, s, "mailer", "order-9.paid", inbox.StatusSucceeded, 2)
	if r.Fence != oldFence+1 || sent.Load() != 1 {
		t.Fatalf("record %+v, %d sends", r, sent.Load())
	}
	_ = db
}

func inboxKillChild(t *testing.T) {
	srv := inboxServer(os.Getenv(envInboxDial))
	db := inboxChildDB(t, srv, os.Getenv(envInboxAddr))
	s := newInboxStore(t, db, srv.dialect)
	in := newSQLInbox(t, s, inbox.Config{Group: "mailer", Lease: time.Second})
	_, _ = in.Handle(context.Background(), inbox.Message{ID: "order-9.paid"}, func(_ context.Context, d inbox.Delivery) error {
		fmt.Printf("claimed fence %d\n", d.Fence)
		select {} // killed here, the claim committed, before finishing
	})
}

// TestInboxTwoProcesses: two processes × 16 goroutines consume one stream
// of 10,000 messages of which 10 % are duplicates (9,000 distinct IDs,
// 1,000 redeliveries placed at random, so that duplicates meet across
// processes); each process takes every other message. Exactly the
// distinct messages' effects: 9,000 rows, one per ID. PostgreSQL and
// MariaDB.
func TestInboxTwoProcesses(t *testing.T) {
	if os.Getenv(envInboxMode) == "stream" {
		inboxStreamChild(t)
		return
	}
	if testing.Short() {
		t.Skip("spawns processes")
	}
	forServers(t, func(t *testing.T, srv server) {
		db, addr, _ := inboxSetup(t, srv)
		start := time.Now().Add(1500 * time.Millisecond)
		var cmds []*exec.Cmd
		outs := make([]*strings.Builder, 2)
		for part := range 2 {
			cmd := exec.Command(os.Args[0], "-test.run=^TestInboxTwoProcesses$", "-test.count=1")
			cmd.Env = append(os.Environ(), envInboxMode+"=stream", envInboxAddr+"="+addr, envInboxDial+"="+srv.dialect.String(),
				envInboxPart+"="+strconv.Itoa(part), envInboxStart+"="+strconv.FormatInt(start.UnixMilli(), 10))
			outs[part] = &strings.Builder{}
			cmd.Stdout, cmd.Stderr = outs[part], outs[part]
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			cmds = append(cmds, cmd)
		}
		processed := 0
		for i, cmd := range cmds {
			if err := cmd.Wait(); err != nil {
				t.Fatalf("child %d: %v\n%s", i, err, outs[i])
			}
			for _, l := range strings.Split(outs[i].String(), "\n") {
				if n, ok := strings.CutPrefix(l, "processed "); ok {
					v, _ := strconv.Atoi(n)
					processed += v
				}
			}
		}
		var rows, distinct, procs int
		if err := db.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT message_id), COUNT(DISTINCT process) FROM inbox_effects`).Scan(&rows, &distinct, &procs); err != nil {
			t.Fatal(err)
		}
		if rows != streamDistinct || distinct != streamDistinct || processed != streamDistinct {
			t.Fatalf("%d effect rows, %d distinct IDs, %d Processed outcomes; want %d", rows, distinct, processed, streamDistinct)
		}
		if procs != 2 {
			t.Fatalf("effects from %d processes, want 2", procs)
		}
		var recs int
		if err := db.QueryRow(`SELECT COUNT(*) FROM idem_inbox WHERE status = 'succeeded'`).Scan(&recs); err != nil || recs != streamDistinct {
			t.Fatalf("%d succeeded records, %v", recs, err)
		}
	})
}

const (
	streamLen      = 10000
	streamDistinct = 9000
)

// stream is the message IDs of TestInboxTwoProcesses, the same in every
// process: every distinct ID once, and 1,000 of them a second time, each
// shuffled in.
func stream() []string {
	r := rand.New(rand.NewPCG(1, 2))
	ids := make([]string, 0, streamLen)
	for i := range streamDistinct {
		ids = append(ids, fmt.Sprint("evt-", i))
	}
	for range streamLen - streamDistinct {
		ids = append(ids, ids[r.IntN(streamDistinct)])
	}
	r.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	return ids
}

func inboxStreamChild(t *testing.T) {
	srv := inboxServer(os.Getenv(envInboxDial))
	db := inboxChildDB(t, srv, os.Getenv(envInboxAddr))
	s := newInboxStore(t, db, srv.dialect)
	in := newSQLInbox(t, s, inbox.Config{})
	part, _ := strconv.Atoi(os.Getenv(envInboxPart))
	ms, _ := strconv.ParseInt(os.Getenv(envInboxStart), 10, 64)
	time.Sleep(time.Until(time.UnixMilli(ms)))
	ids := stream()
	var next, processed atomic.Int64
	next.Store(int64(part))
	h := effect(srv, "p"+strconv.Itoa(part))
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				i := next.Add(2) - 2
				if i >= int64(len(ids)) {
					return
				}
				for {
					o, err := in.HandleTx(context.Background(), db, inbox.Message{ID: ids[i]}, h)
					if err == nil && o.Result == inbox.Processed {
						processed.Add(1)
					}
					if err == nil && o.Result.Ack() {
						break
					}
					if err == nil && o.Result != inbox.InProgress {
						t.Errorf("%s: %+v", ids[i], o)
						return
					}
					time.Sleep(time.Millisecond) // redelivered
				}
			}
		})
	}
	wg.Wait()
	fmt.Printf("processed %d\n", processed.Load())
}

// TestInboxMySQLModes runs inboxtest, and Migrate, in a database of its
// own under each session sql_mode of mysqlModes (EMPTY_STRING_IS_NULL,
// ORACLE, ...). The modes run one after the other on a pool of 4
// connections: MariaDB's 151 connections are shared with the other tests.
func TestInboxMySQLModes(t *testing.T) {
	t.Parallel()
	for _, m := range mysqlModes {
		t.Run(m.String(), func(t *testing.T) {
			admin := mysqlServer.open(t, "")
			name := randomName("idem_inbox_mode_")
			if _, err := admin.ExecContext(t.Context(), "CREATE DATABASE "+name); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP DATABASE "+name) })
			db := openMySQLMode(t, m, name)
			db.SetMaxOpenConns(4)
			s := newInboxStore(t, db, sqlstore.MySQL)
			inboxtest.Run(t, func(*testing.T) inbox.Store { return s }, inboxtest.Caps{
				BeginTx: func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
			})
		})
	}
}
