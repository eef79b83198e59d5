package sqlstore_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/outboxtest"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/pgnotify"
)

// outboxDB returns a database of the test's own and its address (the
// SQLite file, the PostgreSQL URL, the MySQL DSN).
func outboxDB(t *testing.T, srv server) (*sql.DB, string) {
	t.Helper()
	switch srv.dialect {
	case sqlstore.PostgreSQL:
		return testdb.Postgres(t)
	case sqlstore.MySQL:
		db, addr := testdb.MySQL(t)
		db.SetMaxOpenConns(4) // the server's connections are shared
		return db, addr
	}
	addr := filepath.Join(t.TempDir(), "outbox.db")
	return openDB(t, addr), addr
}

func newOutboxStore(t testing.TB, db *sql.DB, cfg sqlstore.OutboxConfig) *sqlstore.OutboxStore {
	t.Helper()
	s, err := sqlstore.NewOutboxStore(db, &cfg)
	if err != nil {
		t.Fatalf("NewOutboxStore: %v", err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// addTx adds msgs in one transaction, committed unless rollback.
func addTx(ctx context.Context, db *sql.DB, s *sqlstore.OutboxStore, rollback bool, msgs ...outbox.Message) ([]string, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	var ids []string
	for _, m := range msgs {
		id, err := s.Add(ctx, tx, m)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	if rollback {
		return ids, tx.Rollback()
	}
	return ids, tx.Commit()
}

func TestOutboxConformance(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		outboxtest.Run(t, func(t *testing.T) outboxtest.Harness {
			db, _ := outboxDB(t, srv)
			h := sqlHarness(t, db, srv.dialect, "db1/")
			// On PostgreSQL the relay listens (package pgnotify): the
			// suite's NotifierWakesRelay checks it wakes at once.
			if srv.dialect == sqlstore.PostgreSQL {
				h.Store = pgnotify.Outbox(h.Store.(*sqlstore.OutboxStore), db)
			}
			return h
		}, outboxtest.Caps{ExclusiveClaims: srv.dialect == sqlstore.SQLite})
	})
}

// sqlHarness is the suite's harness over an OutboxStore on db with
// prefix; Reopen makes another store on db.
func sqlHarness(t *testing.T, db *sql.DB, d sqlstore.Dialect, prefix string) outboxtest.Harness {
	s := newOutboxStore(t, db, sqlstore.OutboxConfig{Dialect: d, IDPrefix: prefix})
	return outboxtest.Harness{
		Store: s,
		Add: func(ctx context.Context, msgs ...outbox.Message) ([]string, error) {
			return addTx(ctx, db, s, false, msgs...)
		},
		AddRollback: func(ctx context.Context, msgs ...outbox.Message) error {
			_, err := addTx(ctx, db, s, true, msgs...)
			return err
		},
		Reopen: func(t *testing.T, prefix string) outboxtest.Harness {
			return sqlHarness(t, db, d, prefix)
		},
	}
}

// TestOutboxRows: what Add writes and what a mark and a sweep leave, in
// the table itself.
func TestOutboxRows(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, _ := outboxDB(t, srv)
		s := newOutboxStore(t, db, sqlstore.OutboxConfig{Dialect: srv.dialect, IDPrefix: "eu/"})
		ids, err := addTx(t.Context(), db, s, false, outbox.Message{Topic: "order.paid", Key: "o-1", Payload: []byte("p"), Headers: map[string]string{"a": "b"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := addTx(t.Context(), db, s, true, outbox.Message{Topic: "order.paid", Key: "o-2"}); err != nil {
			t.Fatal(err)
		}
		var n, pending int
		if err := db.QueryRowContext(t.Context(), `SELECT count(*), count(*) - count(sent_at) FROM idem_outbox`).Scan(&n, &pending); err != nil {
			t.Fatal(err)
		}
		if n != 1 || pending != 1 {
			t.Fatalf("%d rows, %d pending; want the committed message only, pending", n, pending)
		}
		var id int64
		var msgID, topic, key string
		if err := db.QueryRowContext(t.Context(), `SELECT id, msg_id, topic, msg_key FROM idem_outbox`).Scan(&id, &msgID, &topic, &key); err != nil {
			t.Fatal(err)
		}
		if ids[0] != msgID || len(msgID) != len("eu/")+outbox.IDLen || !strings.HasPrefix(msgID, "eu/") || topic != "order.paid" || key != "o-1" {
			t.Fatalf("row %d %s %s %s for ID %s", id, msgID, topic, key, ids[0])
		}
		b, err := s.Claim(t.Context(), 10)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.MarkSent(t.Context(), ids); err != nil {
			t.Fatal(err)
		}
		var sentAt sql.NullInt64
		if err := db.QueryRowContext(t.Context(), `SELECT sent_at FROM idem_outbox`).Scan(&sentAt); err != nil || !sentAt.Valid {
			t.Fatalf("sent_at %v, %v; want set", sentAt, err)
		}
		if d := time.Since(time.UnixMilli(sentAt.Int64)); d < -time.Minute || d > time.Minute {
			t.Fatalf("sent_at %d is not about now", sentAt.Int64)
		}
		time.Sleep(5 * time.Millisecond)
		if k, err := s.Sweep(t.Context(), time.Millisecond, 10); err != nil || k != 1 {
			t.Fatalf("Sweep = %d, %v", k, err)
		}
		if err := db.QueryRowContext(t.Context(), `SELECT count(*) FROM idem_outbox`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d rows after the sweep (%v)", n, err)
		}
	})
}

// Environment of an outbox relay child process.
const (
	envOutboxMode    = "SQLSTORE_TEST_OUTBOX_MODE" // "relay" or "crash"
	envOutboxDialect = "SQLSTORE_TEST_OUTBOX_DIALECT"
	envOutboxAddr    = "SQLSTORE_TEST_OUTBOX_ADDR"
	envOutboxLog     = "SQLSTORE_TEST_OUTBOX_LOG"  // the publisher's file
	envOutboxStop    = "SQLSTORE_TEST_OUTBOX_STOP" // stop once it exists
)

const (
	obProcesses = 2
	obRelays    = 3
	obKeys      = 8
	obPerKey    = 40
)

func outboxChildDB(t *testing.T) (*sql.DB, sqlstore.Dialect) {
	dialect, addr := os.Getenv(envOutboxDialect), os.Getenv(envOutboxAddr)
	if dialect == sqlstore.SQLite.String() {
		return openDB(t, addr), sqlstore.SQLite
	}
	for _, srv := range servers {
		if srv.dialect.String() == dialect {
			db := srv.open(t, addr)
			db.SetMaxOpenConns(8) // 3 relays, 3 listeners (PostgreSQL)
			if srv.dialect == sqlstore.MySQL {
				db.SetMaxOpenConns(4)
			}
			return db, srv.dialect
		}
	}
	t.Fatalf("unknown dialect %q", dialect)
	return nil, nil
}

// fileLog is the test publisher of the child processes: one line per
// message, "ID KEY PAYLOAD", appended with O_APPEND. A line is written
// before Publish returns (the confirmation), so the file's order is the
// order in which the publisher, across processes, received the messages.
type fileLog struct{ f *os.File }

func (l fileLog) Publish(ctx context.Context, m outbox.Message) error {
	_, err := fmt.Fprintf(l.f, "%s %s %s\n", m.ID, m.Key, m.Payload)
	return err
}

func TestOutboxRelayChild(t *testing.T) {
	mode := os.Getenv(envOutboxMode)
	if mode == "" {
		t.Skip("a child of TestOutboxRelayProcesses or TestOutboxRelayKilled")
	}
	db, d := outboxChildDB(t)
	s, err := sqlstore.NewOutboxStore(db, &sqlstore.OutboxConfig{Dialect: d, Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(os.Getenv(envOutboxLog), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var p outbox.Publisher = fileLog{f}
	relays := obRelays
	if mode == "crash" {
		// Publishes one message, confirms it, and dies before the mark.
		relays = 1
		p = outbox.PublisherFunc(func(ctx context.Context, m outbox.Message) error {
			if err := (fileLog{f}).Publish(ctx, m); err != nil {
				return err
			}
			_ = f.Sync()
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		})
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for range relays {
		r, err := outbox.NewRelay(s, p, &outbox.RelayConfig{BatchSize: 5, PollInterval: 20 * time.Millisecond, RetryDelay: 20 * time.Millisecond, Retention: -1})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { _ = r.Run(ctx) })
	}
	for {
		if _, err := os.Stat(os.Getenv(envOutboxStop)); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	wg.Wait()
}

func startOutboxChild(t *testing.T, mode string, srv server, addr, log, stop string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestOutboxRelayChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), envOutboxMode+"="+mode, envOutboxDialect+"="+srv.dialect.String(),
		envOutboxAddr+"="+addr, envOutboxLog+"="+log, envOutboxStop+"="+stop)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, &out
}

type logLine struct{ id, key, payload string }

func readLog(t *testing.T, path string) []logLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []logLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p := strings.SplitN(sc.Text(), " ", 3)
		if len(p) != 3 {
			t.Fatalf("log line %q", sc.Text())
		}
		out = append(out, logLine{p[0], p[1], p[2]})
	}
	return out
}

func pendingCount(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), `SELECT count(*) FROM idem_outbox WHERE sent_at IS NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestOutboxRelayProcesses: 2 processes of 3 relays each drain one
// outbox while the test adds 8 keys × 40 messages: every message reaches
// the publisher exactly once, and each key's in the order added.
func TestOutboxRelayProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	forDialects(t, func(t *testing.T, srv server) {
		db, addr := outboxDB(t, srv)
		s := newOutboxStore(t, db, sqlstore.OutboxConfig{Dialect: srv.dialect})
		dir := t.TempDir()
		log, stop := filepath.Join(dir, "published"), filepath.Join(dir, "stop")
		var cmds []*exec.Cmd
		var outs []*bytes.Buffer
		for range obProcesses {
			c, o := startOutboxChild(t, "relay", srv, addr, log, stop)
			cmds, outs = append(cmds, c), append(outs, o)
		}
		var want []outbox.Message
		for i := range obPerKey {
			var chunk []outbox.Message
			for k := range obKeys {
				chunk = append(chunk, outbox.Message{Topic: "t", Key: fmt.Sprintf("k%d", k), Payload: fmt.Appendf(nil, "%d", i)})
			}
			ids, err := addTx(t.Context(), db, s, false, chunk...)
			if err != nil {
				t.Fatal(err)
			}
			for j := range chunk {
				chunk[j].ID = ids[j]
			}
			want = append(want, chunk...)
		}
		deadline := time.Now().Add(2 * time.Minute)
		for pendingCount(t, db) > 0 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if err := os.WriteFile(stop, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		for i, c := range cmds {
			if err := c.Wait(); err != nil {
				t.Fatalf("child %d: %v\n%s", i, err, outs[i])
			}
		}
		if n := pendingCount(t, db); n != 0 {
			t.Fatalf("%d messages still pending", n)
		}
		var got []outbox.Message
		for _, l := range readLog(t, log) {
			got = append(got, outbox.Message{ID: l.id, Topic: "t", Key: l.key, Payload: []byte(l.payload)})
		}
		outboxtest.CheckOrder(t, got, want, true)
		t.Logf("%d processes × %d relays: %d messages published", obProcesses, obRelays, len(got))
	})
}

// TestOutboxRelayKilled: a relay process dies (SIGKILL) after the
// publisher confirmed a message and before the mark. The message is
// still pending, and the next relay publishes it again with the same ID.
func TestOutboxRelayKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	forDialects(t, func(t *testing.T, srv server) {
		db, addr := outboxDB(t, srv)
		s := newOutboxStore(t, db, sqlstore.OutboxConfig{Dialect: srv.dialect, Lease: time.Second})
		ids, err := addTx(t.Context(), db, s, false,
			outbox.Message{Topic: "t", Key: "k", Payload: []byte("first")},
			outbox.Message{Topic: "t", Key: "k", Payload: []byte("second")})
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		log := filepath.Join(dir, "published")
		c, out := startOutboxChild(t, "crash", srv, addr, log, filepath.Join(dir, "stop"))
		err = c.Wait()
		if ws, ok := c.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("child ended with %v, want killed:\n%s", err, out)
		}
		lines := readLog(t, log)
		if len(lines) != 1 || lines[0].id != ids[0] {
			t.Fatalf("the killed relay published %+v, want %s only", lines, ids[0])
		}
		if n := pendingCount(t, db); n != 2 {
			t.Fatalf("%d pending after the kill, want 2 (the confirmed message was never marked)", n)
		}
		rec := &outboxtest.Recorder{}
		r, err := outbox.NewRelay(s, rec, &outbox.RelayConfig{PollInterval: 20 * time.Millisecond, Retention: -1})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(ctx) }()
		got := rec.WaitFor(t, 2, time.Minute) // on SQLite, after the dead relay's lease
		cancel()
		<-done
		if len(got) != 2 || got[0].ID != ids[0] || string(got[0].Payload) != "first" || got[1].ID != ids[1] {
			t.Fatalf("the next relay published %+v, want %s again (same ID) and then %s", got, ids[0], ids[1])
		}
		if n := pendingCount(t, db); n != 0 {
			t.Fatalf("%d pending, want 0", n)
		}
	})
}

// TestOutboxIDPrefix: an IDPrefix that would make message IDs no inbox
// accepts (a control character, invalid UTF-8, so long that prefix and
// generated part pass inbox.MaxIDLen) is refused by NewOutboxStore; before, every
// message the outbox published was dead-lettered by its consumers
// (inbox.ErrInvalid). An accepted prefix gives IDs inbox.Validate takes.
func TestOutboxIDPrefix(t *testing.T) {
	t.Parallel()
	db := openDB(t, filepath.Join(t.TempDir(), "prefix.db"))
	for _, p := range []string{"shop\n", "shop\x00/", "\xffshop/", strings.Repeat("p", inbox.MaxIDLen-outbox.IDLen+1)} {
		if _, err := sqlstore.NewOutboxStore(db, &sqlstore.OutboxConfig{Dialect: sqlstore.SQLite, IDPrefix: p}); err == nil {
			t.Errorf("NewOutboxStore(IDPrefix %q) accepted a prefix whose IDs inbox.Validate refuses", p)
		}
	}
	for _, p := range []string{"", "shop-eu/", strings.Repeat("p", inbox.MaxIDLen-outbox.IDLen)} {
		s := newOutboxStore(t, db, sqlstore.OutboxConfig{Dialect: sqlstore.SQLite, IDPrefix: p})
		id, err := addTx(t.Context(), db, s, false, outbox.Message{Topic: "t"})
		if err != nil {
			t.Fatal(err)
		}
		if err := inbox.Validate(id[0]); err != nil || !strings.HasPrefix(id[0], p) {
			t.Errorf("IDPrefix %q: ID %q: %v", p, id[0], err)
		}
	}
}

// TestOutboxAddOtherDB: Add works in a transaction of another *sql.DB on
// the store's database, also once Claim has prepared and cached the
// store's own insert statement, which database/sql refuses to bind to
// that transaction: the message is written, and Claim returns it.
func TestOutboxAddOtherDB(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, addr := outboxDB(t, srv)
		var other *sql.DB
		if srv.dialect == sqlstore.SQLite {
			other = openDB(t, addr)
		} else {
			other = srv.open(t, addr)
			other.SetMaxOpenConns(2)
		}
		s := newOutboxStore(t, db, sqlstore.OutboxConfig{Dialect: srv.dialect})
		ctx := t.Context()
		var want []string
		for _, round := range []string{"cold", "warm"} {
			ids, err := addTx(ctx, other, s, false, outbox.Message{Topic: "t", Key: round, Payload: []byte(round)})
			if err != nil {
				t.Fatalf("Add (%s) in a transaction of another *sql.DB: %v", round, err)
			}
			want = append(want, ids...)
			// Claim prepares the insert on the store's *sql.DB for the
			// next round.
			b, err := s.Claim(ctx, 10)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range b.Messages() {
				got = append(got, m.ID)
			}
			if err := b.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("Claim after the %s Add = %v, want %v", round, got, want)
			}
		}
	})
}

// TestOutboxAddRefusesReservedHeaders: a message with a header the broker
// or the publisher interprets (Nats-*, RabbitMQ's CC) is refused before
// any statement: the caller's transaction commits without it.
func TestOutboxAddRefusesReservedHeaders(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, _ := outboxDB(t, srv)
		s := newOutboxStore(t, db, sqlstore.OutboxConfig{Dialect: srv.dialect})
		ctx := t.Context()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback() //nolint:errcheck // a no-op after Commit
		for _, name := range []string{"Nats-Msg-Id", "Nats-TTL", "nats-expected-last-sequence", "CC"} {
			_, err := s.Add(ctx, tx, outbox.Message{Topic: "t", Key: "k", Headers: map[string]string{"traceparent": "x", name: "1"}})
			if !errors.Is(err, outbox.ErrInvalid) || !strings.Contains(err.Error(), name) {
				t.Errorf("Add with header %s = %v, want ErrInvalid naming it", name, err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idem_outbox`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d rows after refused Adds (%v), want none", n, err)
		}
	})
}
