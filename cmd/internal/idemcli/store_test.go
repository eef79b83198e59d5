package idemcli

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/internal/testdb"
)

// run runs idem with args and stdin, and returns its exit status, stdout
// and stderr.
func run(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Main(context.Background(), args, strings.NewReader(stdin), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// idemTables are the tables idem migrate creates.
var idemTables = []string{"idem_records", "idem_tokens", "idem_locks", "idem_outbox", "idem_inbox", "idem_ops", "idem_steps", "idem_schema_migrations"}

// migrateTargets are the databases the migrate tests run on: setup returns
// the -db value, a pool on the same database (nil for SQLite: opened
// after the migrations) and the query counting a table's instances in
// that database.
var migrateTargets = []struct {
	name  string
	setup func(t *testing.T) (raw string, db *sql.DB, count string)
}{
	{"SQLite", func(t *testing.T) (string, *sql.DB, string) {
		return "sqlite:" + filepath.Join(t.TempDir(), "idem.db"), nil,
			"SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?"
	}},
	{"PostgreSQL", func(t *testing.T) (string, *sql.DB, string) {
		db, url := testdb.Postgres(t)
		return url, db, "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = $1"
	}},
	{"MariaDB", func(t *testing.T) (string, *sql.DB, string) {
		db, dsn := testdb.MySQL(t)
		return "mysql:" + dsn, db, "SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?"
	}},
}

// wantMigratedOnce checks the database raw (db, if not nil, is a pool on
// it; count counts a table's instances): each idem table exists once and
// each migration is recorded once. It returns the pool (opened on raw
// until the test ends, when db is nil) and the number of migrations.
func wantMigratedOnce(t *testing.T, raw string, db *sql.DB, count string) (*sql.DB, int) {
	t.Helper()
	if db == nil {
		st, err := storeFlags{name: "db", raw: raw}.open(context.Background(), openOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		db = st.db
	}
	ctx := context.Background()
	for _, table := range idemTables {
		var k int
		if err := db.QueryRowContext(ctx, count, table).Scan(&k); err != nil || k != 1 {
			t.Errorf("table %s: %d instances, %v; want 1", table, k, err)
		}
	}
	var versions, distinct int
	if err := db.QueryRowContext(ctx, "SELECT count(*), count(DISTINCT version) FROM idem_schema_migrations").Scan(&versions, &distinct); err != nil {
		t.Fatal(err)
	}
	if versions == 0 || versions != distinct {
		t.Errorf("idem_schema_migrations: %d rows, %d versions; want each version once", versions, distinct)
	}
	return db, versions
}

// 8 concurrent migrates of a fresh database: all succeed, each table
// exists once, each migration is recorded once; a re-run applies nothing.
func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	for _, c := range migrateTargets {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			raw, db, count := c.setup(t)
			const n = 8
			codes := make([]int, n)
			outs := make([]string, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					var stdout, stderr bytes.Buffer
					codes[i] = Main(context.Background(), []string{"migrate", "-db", raw}, strings.NewReader(""), &stdout, &stderr)
					outs[i] = stdout.String() + stderr.String()
				})
			}
			wg.Wait()
			applied := 0
			for i := range n {
				if codes[i] != exitOK {
					t.Fatalf("migrate %d: exit %d: %s", i, codes[i], outs[i])
				}
				if strings.Contains(outs[i], ": applied ") {
					applied++
				}
			}
			if applied != 1 {
				t.Errorf("%d of %d migrates applied migrations, want 1:\n%s", applied, n, strings.Join(outs, ""))
			}
			db, versions := wantMigratedOnce(t, raw, db, count)

			code, out, errOut := run(t, "", "migrate", "-db", raw)
			if code != exitOK || !strings.Contains(out, "up to date") {
				t.Fatalf("re-run: exit %d, %q %q; want up to date", code, out, errOut)
			}
			var again int
			if err := db.QueryRowContext(context.Background(), "SELECT count(*) FROM idem_schema_migrations").Scan(&again); err != nil || again != versions {
				t.Errorf("after the re-run: %d migrations, %v; want %d", again, err, versions)
			}
		})
	}
}

// storeAt opens a migrated SQLite store in the test's directory and
// returns its -db value.
func storeAt(t *testing.T) (string, *openedStore) {
	t.Helper()
	raw := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	st, err := storeFlags{name: "db", raw: raw}.open(context.Background(), openOptions{migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return raw, st
}

// put writes a record: completed with resp if resp is not nil, else in
// flight.
func put(t *testing.T, s idem.Store, scope, key string, lease, retention time.Duration, resp *idem.Response) {
	t.Helper()
	ctx := context.Background()
	res, err := s.Acquire(ctx, idem.AcquireRequest{Scope: scope, Key: key, Fingerprint: "fp", Lease: lease, Retention: retention})
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("Acquire(%q, %q): %+v, %v", scope, key, res, err)
	}
	if resp != nil {
		if err := s.Complete(ctx, res.Lease, *resp, retention); err != nil {
			t.Fatal(err)
		}
	}
}

// sweep removes the expired records and tokens, and leaves records in
// flight and live ones.
func TestSweep(t *testing.T) {
	t.Parallel()
	raw, st := storeAt(t)
	resp := &idem.Response{StatusCode: 201, Body: []byte("ok")}
	put(t, st.store, "", "expired-1", time.Minute, time.Millisecond, resp)
	put(t, st.store, "", "expired-2", time.Minute, time.Millisecond, resp)
	put(t, st.store, "", "live", time.Minute, time.Hour, resp)
	put(t, st.store, "", "in-flight", time.Minute, time.Millisecond, nil)
	// Wait for the database's clock to pass the expiry.
	deadline := time.Now().Add(5 * time.Second)
	for {
		rec, err := st.store.Get(context.Background(), "", "expired-2")
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(rec.ExpiresAt.Add(5 * time.Millisecond)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the record does not expire")
		}
		time.Sleep(5 * time.Millisecond)
	}
	code, out, errOut := run(t, "", "sweep", "-db", raw)
	if code != exitOK || !strings.Contains(out, "removed 2 records, 0 tokens") {
		t.Fatalf("sweep: exit %d, %q %q; want 2 records removed", code, out, errOut)
	}
	for key, want := range map[string]bool{"expired-1": false, "expired-2": false, "live": true, "in-flight": true} {
		_, err := st.store.Get(context.Background(), "", key)
		if got := err == nil; got != want {
			t.Errorf("%s after the sweep: %v; want kept %v", key, err, want)
		}
	}

	// -every sweeps until stopped, then exits 0.
	ctx, cancel := context.WithCancel(context.Background())
	stdout := &obstest.LogBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"sweep", "-db", raw, "-every", "10ms", "-retention", "24h"}, strings.NewReader(""), stdout, io.Discard)
	}()
	for strings.Count(stdout.String(), "removed") < 2 {
		select {
		case code := <-done:
			t.Fatalf("sweep -every exited %d: %s", code, stdout)
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Fatalf("sweep -every stopped with exit %d", code)
	}
	if !strings.Contains(stdout.String(), "0 outbox messages, 0 inbox records") {
		t.Errorf("sweep -retention: %q; want the outbox and inbox reported", stdout)
	}
}

func TestInspect(t *testing.T) {
	t.Parallel()
	raw, st := storeAt(t)
	scope := hashScope("api-key-1")
	put(t, st.store, scope, "order-1", time.Minute, time.Hour, &idem.Response{
		StatusCode: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"secret":"card-1234"}`)})
	put(t, st.store, "", "order-2", time.Minute, time.Hour, nil)

	code, out, errOut := run(t, "", "inspect", "-db", raw, "-scope-header-value", "api-key-1", "-key", "order-1")
	if code != exitOK {
		t.Fatalf("inspect: exit %d %s", code, errOut)
	}
	for _, want := range []string{"completed", "fence        1", "response     201, body 22 bytes", "Content-Type: application/json", scope} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "card-1234") {
		t.Errorf("inspect shows the body without -body:\n%s", out)
	}
	if _, out, _ := run(t, "", "inspect", "-db", raw, "-scope", scope, "-key", "order-1", "-body"); !strings.Contains(out, `{"secret":"card-1234"}`) {
		t.Errorf("inspect -body lacks the body:\n%s", out)
	}
	if code, _, errOut := run(t, "", "inspect", "-db", raw, "-key", "order-1"); code != exitFail || !strings.Contains(errOut, "no record") {
		t.Errorf("inspect in the wrong scope: exit %d %q", code, errOut)
	}

	code, out, _ = run(t, "", "inspect", "-db", raw)
	inFlight, oldest, _ := strings.Cut(out, "Oldest")
	if code != exitOK || !strings.Contains(inFlight, `key="order-2" processing`) || strings.Contains(inFlight, "order-1") ||
		!strings.Contains(oldest, `key="order-1" completed`) || !strings.Contains(oldest, `key="order-2"`) {
		t.Fatalf("inspect lists: exit %d\n%s", code, out)
	}
}

func TestEvict(t *testing.T) {
	t.Parallel()
	raw, st := storeAt(t)
	resp := &idem.Response{StatusCode: 201, Body: []byte("ok")}
	put(t, st.store, "tenant", "k", time.Minute, time.Hour, resp)
	has := func() bool {
		_, err := st.store.Get(context.Background(), "tenant", "k")
		if err != nil && !errors.Is(err, idem.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	for _, answer := range []string{"", "n\n", "no\n"} {
		code, out, errOut := run(t, answer, "evict", "-db", raw, "-scope", "tenant", "-key", "k")
		if code != exitFail || !strings.Contains(out, "Delete this record?") || !strings.Contains(errOut, "not deleted") || !has() {
			t.Fatalf("answer %q: exit %d %q %q, record kept %v; want it kept", answer, code, out, errOut, has())
		}
	}
	if code, out, errOut := run(t, "y\n", "evict", "-db", raw, "-scope", "tenant", "-key", "k"); code != exitOK || !strings.Contains(out, "deleted") || has() {
		t.Fatalf("answer y: exit %d %q %q, record kept %v; want it deleted", code, out, errOut, has())
	}
	put(t, st.store, "tenant", "k", time.Minute, time.Hour, resp)
	if code, _, errOut := run(t, "", "evict", "-db", raw, "-scope", "tenant", "-key", "k", "-yes"); code != exitOK || has() {
		t.Fatalf("-yes: exit %d %q, record kept %v", code, errOut, has())
	}
	if code, _, errOut := run(t, "", "evict", "-db", raw, "-scope", "tenant", "-key", "k", "-yes"); code != exitFail || !strings.Contains(errOut, "no record") {
		t.Fatalf("evict of nothing: exit %d %q", code, errOut)
	}
}

// Bad flags are exit status 2 with a message that names the flag; help
// explains each command's flags.
func TestStoreCommandsUsage(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate"}, "-db is required"},
		{[]string{"migrate", "-db", "redis://127.0.0.1:6379/0"}, "needs no migration"},
		{[]string{"migrate", "-db", "oracle://x"}, "-db"},
		{[]string{"sweep"}, "-db is required"},
		{[]string{"sweep", "-db", "sqlite:x.db", "-every", "-1s"}, "-every"},
		{[]string{"inspect", "-db", "sqlite:x.db", "-scope", "a", "-scope-header-value", "b", "-key", "k"}, "not both"},
		{[]string{"inspect", "-db", "sqlite:x.db", "-body"}, "-key is required"},
		{[]string{"evict", "-db", "sqlite:x.db"}, "-key is required"},
		{[]string{"evict", "-db", "sqlite:x.db", "-key", "k", "stray"}, "unexpected argument"},
		{[]string{"inspect", "-nope"}, "-nope"},
	} {
		code, _, errOut := run(t, "", c.args...)
		if code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("idem %q: exit %d %q; want exit 2 naming %s", c.args, code, errOut, c.want)
		}
	}
	for _, name := range []string{"proxy", "migrate", "sweep", "inspect", "evict"} {
		code, out, _ := run(t, "", "help", name)
		if code != exitOK || !strings.Contains(out, "Usage: idem "+name) || !strings.Contains(out, "Flags:") || !strings.Contains(out, "-db") && name != "proxy" {
			t.Errorf("idem help %s: exit %d\n%s", name, code, out)
		}
	}
}
