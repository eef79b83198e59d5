package sqlstore_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/storetest"
)

// A server is a database server the store runs against in tests. The
// servers share their database between test runs and packages: every
// test isolates itself by a random scope (or, for Migrate, a schema or
// database of its own).
type server struct {
	dialect sqlstore.Dialect
	svc     testenv.Service
	driver  string
	// bizTable creates the business table of the CompleteTx tests, named
	// by its argument, unless it exists.
	bizTable string
}

var servers = []server{
	{sqlstore.PostgreSQL, testenv.Postgres, "pgx", `CREATE TABLE IF NOT EXISTS %s (id text PRIMARY KEY, amount bigint NOT NULL)`},
	{sqlstore.MySQL, testenv.MySQL, "mysql", `CREATE TABLE IF NOT EXISTS %s (id VARBINARY(255) PRIMARY KEY, amount BIGINT NOT NULL) ENGINE = InnoDB`},
}

// forServers runs f as a subtest for each server, in parallel.
func forServers(t *testing.T, f func(t *testing.T, srv server)) {
	forEach(t, servers, f)
}

// sqliteServer is SQLite in the shape of a server: setup opens a fresh file in
// the test's temporary directory.
var sqliteServer = server{dialect: sqlstore.SQLite, bizTable: `CREATE TABLE IF NOT EXISTS %s (id TEXT PRIMARY KEY, amount INTEGER NOT NULL)`}

// forDialects runs f on SQLite and on each server.
func forDialects(t *testing.T, f func(t *testing.T, srv server)) {
	forEach(t, append([]server{sqliteServer}, servers...), f)
}

func forEach(t *testing.T, list []server, f func(t *testing.T, srv server)) {
	for _, srv := range list {
		t.Run(srv.dialect.String(), func(t *testing.T) {
			t.Parallel()
			f(t, srv)
		})
	}
}

// rebind turns a statement written with ? placeholders into the server's.
func (srv server) rebind(q string) string {
	if srv.dialect != sqlstore.PostgreSQL {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// open opens the server's test database at addr (the service's address
// when empty), or skips t if the server is unreachable.
func (srv server) open(t testing.TB, addr string) *sql.DB {
	t.Helper()
	if addr == "" {
		addr = srv.svc.Need(t)
	}
	db, err := sql.Open(srv.driver, addr)
	if err != nil {
		t.Fatalf("sql.Open(%s): %v", srv.driver, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	// Below PostgreSQL's default of 100 connections even with the 4
	// processes of TestMultiProcess, the parallel tests and the other test
	// packages that run at the same time: a pool keeps at most 2 idle.
	db.SetMaxOpenConns(10)
	db.SetMaxIdleConns(2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		testenv.Unavailable(t, srv.svc.Name, srv.svc.Var, err)
	}
	return db
}

// addrWith returns the server's address with pg applied to the query of
// the PostgreSQL URL, or my to the parsed go-sql-driver config.
func (srv server) addrWith(t *testing.T, pg func(url.Values), my func(*mysql.Config)) string {
	t.Helper()
	switch srv.dialect {
	case sqlstore.PostgreSQL:
		u, err := url.Parse(srv.svc.Addr())
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		pg(q)
		// pgx reads a space as "%20", not as "+".
		u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
		return u.String()
	case sqlstore.MySQL:
		cfg, err := mysql.ParseDSN(srv.svc.Addr())
		if err != nil {
			t.Fatal(err)
		}
		my(cfg)
		return cfg.FormatDSN()
	}
	t.Fatalf("addrWith: no address for %s", srv.dialect)
	return ""
}

// setup opens the server's test database and returns it with a migrated
// store.
func (srv server) setup(t testing.TB) (*sql.DB, *sqlstore.Store) {
	t.Helper()
	if srv.dialect == sqlstore.SQLite {
		return setup(t)
	}
	db := srv.open(t, "")
	s, err := sqlstore.New(db, &sqlstore.Config{Dialect: srv.dialect})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return db, s
}

// table creates (once per database) the business table name.
func (srv server) table(t testing.TB, db *sql.DB, name string) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), fmt.Sprintf(srv.bizTable, name)); err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
}

// randomName returns prefix followed by 12 random hex digits.
func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func TestServerConformance(t *testing.T) {
	forServers(t, func(t *testing.T, srv server) {
		db, s := srv.setup(t)
		storetest.Run(t, func(*testing.T) idem.Store { return s }, storetest.Caps{
			BeginTx:   func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
			Precision: time.Millisecond,
		})
	})
}

// TestServerAcquireRace: 200 goroutines race Acquire on one key, three
// times over: exactly one is told Acquired each time, and none fails.
// TestAcquireRace: 200 goroutines race Acquire on one key, three times
// over, on every dialect: exactly one is told Acquired each time.
func TestAcquireRace(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		_, s := srv.setup(t)
		acquireRace(t, s)
	})
}

// TestCompleteTx: the completion commits with the business
// transaction, or rolls back with it; a stale lease is refused inside it.
func TestCompleteTx(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, s := srv.setup(t)
		ctx := t.Context()
		srv.table(t, db, "idem_test_orders")
		scope := randomName("ctx-")
		r := func(key string) idem.AcquireRequest {
			return idem.AcquireRequest{Scope: scope, Key: key, Fingerprint: "fp", Lease: long, Retention: long}
		}
		run := func(key string, commit bool) idem.Lease {
			t.Helper()
			l := mustAcquire(t, s, r(key), idem.Acquired).Lease
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if _, err := tx.ExecContext(ctx, srv.rebind(`INSERT INTO idem_test_orders (id, amount) VALUES (?, 1)`), scope+key); err != nil {
				t.Fatal(err)
			}
			if err := s.CompleteTx(ctx, tx, l, idem.Response{StatusCode: 201, Body: []byte("ok")}, long); err != nil {
				t.Fatal(err)
			}
			if commit {
				err = tx.Commit()
			} else {
				err = tx.Rollback()
			}
			if err != nil {
				t.Fatal(err)
			}
			return l
		}
		count := func(key string) (n int) {
			t.Helper()
			if err := db.QueryRowContext(ctx, srv.rebind(`SELECT count(*) FROM idem_test_orders WHERE id = ?`), scope+key).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}

		run("committed", true)
		if rec, err := s.Get(ctx, scope, "committed"); err != nil || rec.Status != idem.StatusCompleted || string(rec.Response.Body) != "ok" {
			t.Fatalf("after commit: %+v, %v", rec, err)
		}
		if count("committed") != 1 {
			t.Fatal("business row missing after commit")
		}

		l := run("rolled back", false)
		rec, err := s.Get(ctx, scope, "rolled back")
		if err != nil || rec.Status != idem.StatusProcessing || rec.Response != nil || rec.Owner != l.Owner {
			t.Fatalf("after rollback: %+v, %v", rec, err)
		}
		if count("rolled back") != 0 {
			t.Fatal("business row present after rollback")
		}
		if err := s.Complete(ctx, l, idem.Response{StatusCode: 200}, long); err != nil {
			t.Fatalf("Complete after rollback: %v", err)
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := s.CompleteTx(ctx, tx, l, idem.Response{StatusCode: 200}, long); !errors.Is(err, idem.ErrFinished) {
			t.Fatalf("CompleteTx of a record the lease completed = %v, want ErrFinished", err)
		}
		stale := l
		stale.Owner = idem.NewOwner()
		if err := s.CompleteTx(ctx, tx, stale, idem.Response{StatusCode: 200}, long); !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("CompleteTx of a completed record by another owner = %v, want ErrLeaseLost", err)
		}
	})
}

// TestCompleteTxBlocksTakeover: while CompleteTx's transaction is
// open, a takeover of the (ended) lease waits for it and then sees the
// record completed.
func TestCompleteTxBlocksTakeover(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, s := srv.setup(t)
		ctx := t.Context()
		r := idem.AcquireRequest{Scope: randomName("takeover-"), Key: "k", Fingerprint: "fp", Lease: short, Retention: long}
		l := mustAcquire(t, s, r, idem.Acquired).Lease
		time.Sleep(short + 20*time.Millisecond) // the lease ran out, nobody took over
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := s.CompleteTx(ctx, tx, l, idem.Response{StatusCode: 200}, long); err != nil {
			t.Fatal(err)
		}
		got := make(chan idem.AcquireResult, 1)
		go func() {
			r := r
			r.Lease = long
			res, err := s.Acquire(context.Background(), r)
			if err != nil {
				t.Error(err)
			}
			got <- res
		}()
		select {
		case res := <-got:
			t.Fatalf("Acquire did not wait for the transaction: %v", res.Outcome)
		case <-time.After(200 * time.Millisecond):
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if res := <-got; res.Outcome != idem.Completed || res.Record.Fence != l.Fence {
			t.Fatalf("Acquire after commit = %v (%+v), want completed", res.Outcome, res.Record)
		}
	})
}

// TestServerTakeover: a processing record whose lease ended is taken
// over with fence + 1 and its created_at kept, and an expired completed
// record is replaced, on each server (the upserts' conditional
// assignments).
func TestServerTakeover(t *testing.T) {
	forServers(t, func(t *testing.T, srv server) {
		_, s := srv.setup(t)
		r := idem.AcquireRequest{Scope: randomName("to-"), Key: "k", Fingerprint: "fp", Lease: short, Retention: long}
		first := mustAcquire(t, s, r, idem.Acquired)
		before, err := s.Get(t.Context(), r.Scope, r.Key)
		if err != nil {
			t.Fatal(err)
		}
		mustAcquire(t, s, r, idem.InFlight)
		other := r
		other.Fingerprint = "other"
		mustAcquire(t, s, other, idem.Mismatch)
		time.Sleep(short + 20*time.Millisecond)
		mustAcquire(t, s, other, idem.Mismatch)
		second := mustAcquire(t, s, r, idem.Acquired)
		if !second.TookOver || second.Lease.Fence != first.Lease.Fence+1 {
			t.Fatalf("takeover = %+v, want TookOver and fence %d", second, first.Lease.Fence+1)
		}
		after, err := s.Get(t.Context(), r.Scope, r.Key)
		if err != nil || !after.CreatedAt.Equal(before.CreatedAt) || after.Owner != second.Lease.Owner || after.Status != idem.StatusProcessing {
			t.Fatalf("after takeover: %+v, %v (before %+v)", after, err, before)
		}
		if err := s.Complete(t.Context(), first.Lease, idem.Response{StatusCode: 200}, long); !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("stale Complete = %v", err)
		}
		if err := s.Complete(t.Context(), second.Lease, idem.Response{StatusCode: 200, Body: []byte("b")}, 50*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		mustAcquire(t, s, other, idem.Mismatch)
		time.Sleep(70 * time.Millisecond)
		third := mustAcquire(t, s, other, idem.Acquired)
		if third.TookOver || third.Lease.Fence != second.Lease.Fence+1 {
			t.Fatalf("replacement = %+v, want fence %d, not TookOver", third, second.Lease.Fence+1)
		}
		rec, err := s.Get(t.Context(), r.Scope, r.Key)
		if err != nil || rec.Response != nil || rec.Fingerprint != "other" || rec.CompletedAt != (time.Time{}) || !rec.CreatedAt.After(before.CreatedAt) {
			t.Fatalf("after replacement: %+v, %v", rec, err)
		}
		// Keys differing only by case or trailing space are distinct.
		for _, k := range []string{"K", "k ", "k  "} {
			r := r
			r.Key = k
			mustAcquire(t, s, r, idem.Acquired)
		}
	})
}

// TestDuplicateDuringCompleteTx: while a CompleteTx holds the record's
// row in an open transaction, a duplicate (the lease is live) and a
// mismatch are answered at once, from what committed before, instead of
// waiting for that transaction. (SQLite serialises everything on its one
// connection, so it is not in this test.)
func TestDuplicateDuringCompleteTx(t *testing.T) {
	forServers(t, func(t *testing.T, srv server) {
		db, s := srv.setup(t)
		ctx := t.Context()
		r := idem.AcquireRequest{Scope: randomName("dup-"), Key: "k", Fingerprint: "fp", Lease: long, Retention: long}
		l := mustAcquire(t, s, r, idem.Acquired).Lease
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := s.CompleteTx(ctx, tx, l, idem.Response{StatusCode: 200}, long); err != nil {
			t.Fatal(err)
		}
		other := r
		other.Fingerprint = "other"
		for _, c := range []struct {
			req  idem.AcquireRequest
			want idem.Outcome
		}{{r, idem.InFlight}, {other, idem.Mismatch}} {
			// A lock wait would last until the transaction ends (PostgreSQL)
			// or innodb_lock_wait_timeout (50 s): 5 s tells them apart.
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			start := time.Now()
			res, err := s.Acquire(cctx, c.req)
			cancel()
			if err != nil || res.Outcome != c.want || res.Record.Fence != l.Fence {
				t.Fatalf("Acquire(fp %s) during CompleteTx = %v, %v after %v; want %v at once", c.req.Fingerprint, res.Outcome, err, time.Since(start), c.want)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		mustAcquire(t, s, r, idem.Completed)
	})
}

// TestReadOnlyAnswers: a replay, a duplicate in flight and a mismatch
// write nothing: a store whose sessions are read-only answers them, and
// fails only where Acquire must write (a new key). On PostgreSQL this
// proves that the acquire statement never executes its write branch for
// a key it cannot take.
func TestReadOnlyAnswers(t *testing.T) {
	forServers(t, func(t *testing.T, srv server) {
		_, s := srv.setup(t)
		addr := srv.addrWith(t,
			func(q url.Values) { q.Set("default_transaction_read_only", "on") },
			func(cfg *mysql.Config) {
				if cfg.Params == nil {
					cfg.Params = map[string]string{}
				}
				cfg.Params["tx_read_only"] = "1"
			})
		ro, err := sqlstore.New(srv.open(t, addr), &sqlstore.Config{Dialect: srv.dialect})
		if err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		r := idem.AcquireRequest{Scope: randomName("ro-"), Key: "done", Fingerprint: "fp", Lease: long, Retention: long}
		done := mustAcquire(t, s, r, idem.Acquired)
		if err := s.Complete(ctx, done.Lease, idem.Response{StatusCode: 201, Body: []byte("ok")}, long); err != nil {
			t.Fatal(err)
		}
		running := r
		running.Key = "running"
		mustAcquire(t, s, running, idem.Acquired)
		other := r
		other.Fingerprint = "other"
		for range 3 {
			if res := mustAcquire(t, ro, r, idem.Completed); string(res.Record.Response.Body) != "ok" {
				t.Fatalf("read-only replay = %+v", res.Record.Response)
			}
			mustAcquire(t, ro, running, idem.InFlight)
			mustAcquire(t, ro, other, idem.Mismatch)
		}
		fresh := r
		fresh.Key = "new"
		if res, err := ro.Acquire(ctx, fresh); err == nil {
			t.Fatalf("Acquire of a new key on a read-only session = %v; want the server's read-only error", res.Outcome)
		}
		if _, err := s.Get(ctx, r.Scope, "new"); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("the read-only session wrote a record: %v", err)
		}
	})
}

// TestCompleteRecord: CompleteRecord completes as Complete does and
// returns what Get then returns, with a response that shares nothing with
// the caller's; a stale lease gets ErrLeaseLost and changes nothing.
func TestCompleteRecord(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		_, s := srv.setup(t)
		ctx := t.Context()
		r := idem.AcquireRequest{Scope: randomName("cr-"), Key: "k", Fingerprint: "fp", Lease: long, Retention: long}
		res := mustAcquire(t, s, r, idem.Acquired)
		resp := idem.Response{StatusCode: 201, Header: map[string][]string{"Location": {"/o/1"}}, Body: []byte("created")}
		stale := res.Lease
		stale.Fence++
		if _, err := s.CompleteRecord(ctx, stale, resp, time.Hour); !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("CompleteRecord with a stale fence = %v, want ErrLeaseLost", err)
		}
		if rec, err := s.Get(ctx, r.Scope, r.Key); err != nil || rec.Status != idem.StatusProcessing {
			t.Fatalf("after the stale completion: %+v, %v", rec, err)
		}
		rec, err := s.CompleteRecord(ctx, res.Lease, resp, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body[0] = 'X'
		resp.Header["Location"][0] = "changed"
		got, err := s.Get(ctx, r.Scope, r.Key)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(rec.Response, got.Response) || string(rec.Response.Body) != "created" || rec.Response.Header["Location"][0] != "/o/1" {
			t.Fatalf("CompleteRecord response %+v, Get's %+v", rec.Response, got.Response)
		}
		rec.Response, got.Response = nil, nil
		for _, f := range [][2]time.Time{{rec.LeaseUntil, got.LeaseUntil}, {rec.CreatedAt, got.CreatedAt}, {rec.CompletedAt, got.CompletedAt}, {rec.ExpiresAt, got.ExpiresAt}} {
			if !f[0].Equal(f[1]) {
				t.Fatalf("CompleteRecord = %+v, Get = %+v", rec, got)
			}
		}
		rec.LeaseUntil, rec.CreatedAt, rec.CompletedAt, rec.ExpiresAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		got.LeaseUntil, got.CreatedAt, got.CompletedAt, got.ExpiresAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		if rec != got || got.Status != idem.StatusCompleted || got.Retention != time.Hour {
			t.Fatalf("CompleteRecord = %+v, Get = %+v", rec, got)
		}
		// A retry (the first reply was lost) returns the stored record,
		// with the first response, whatever it carries.
		again, err := s.CompleteRecord(ctx, res.Lease, idem.Response{StatusCode: 500}, 2*time.Hour)
		if err != nil {
			t.Fatalf("second CompleteRecord = %v, want the stored record", err)
		}
		stored, err := s.Get(ctx, r.Scope, r.Key)
		if err != nil {
			t.Fatal(err)
		}
		if d := storetest.DiffRecord(again, stored); d != "" || string(again.Response.Body) != "created" {
			t.Fatalf("second CompleteRecord returned %+v, differs from Get's: %s", again, d)
		}
		if _, err := s.CompleteRecord(ctx, stale, resp, time.Hour); !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("CompleteRecord of a completed record with a stale fence = %v, want ErrLeaseLost", err)
		}
	})
}

// TestServerMigrate: 8 goroutines migrate a new schema (PostgreSQL) or
// database (MySQL) at once; then Migrate again is a no-op, the version is
// recorded once, and a store that was never migrated says to migrate.
func TestServerMigrate(t *testing.T) {
	forServers(t, func(t *testing.T, srv server) {
		admin := srv.open(t, "")
		ctx := t.Context()
		name := randomName("idem_migrate_")
		switch srv.dialect {
		case sqlstore.PostgreSQL:
			if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+name); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP SCHEMA "+name+" CASCADE") })
		case sqlstore.MySQL:
			if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP DATABASE "+name) })
		}
		addr := srv.addrWith(t,
			func(q url.Values) { q.Set("search_path", name) },
			func(cfg *mysql.Config) { cfg.DBName = name })
		db := srv.open(t, addr)
		s, err := sqlstore.New(db, &sqlstore.Config{Dialect: srv.dialect})
		if err != nil {
			t.Fatal(err)
		}
		r := idem.AcquireRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: long, Retention: long}
		if _, err := s.Acquire(ctx, r); err == nil || !strings.Contains(err.Error(), "Migrate") {
			t.Errorf("Acquire before Migrate = %v, want a hint to migrate", err)
		}
		race(8, func(i int) {
			s, err := sqlstore.New(db, &sqlstore.Config{Dialect: srv.dialect})
			if err == nil {
				err = s.Migrate(context.Background())
			}
			if err != nil {
				t.Errorf("Migrate %d: %v", i, err)
			}
		})
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("Migrate again: %v", err)
		}
		rows, err := db.QueryContext(ctx, `SELECT version, name, applied_at FROM idem_schema_migrations ORDER BY version`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var versions []string
		for rows.Next() {
			var v, at int64
			var name string
			if err := rows.Scan(&v, &name, &at); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(time.UnixMilli(at)); d < -time.Minute || d > time.Minute {
				t.Errorf("version %d applied_at %v", v, time.UnixMilli(at))
			}
			versions = append(versions, fmt.Sprintf("%d_%s", v, name))
		}
		if want := sqlstore.MigrationNames(srv.dialect); !slices.Equal(versions, want) {
			t.Fatalf("recorded versions = %v, want %v", versions, want)
		}
		mustAcquire(t, s, r, idem.Acquired)

	})
}

// TestServerUpgrade: a PostgreSQL database that older builds migrated to
// version 1, then 2, with records they wrote in flight, is brought up to
// date by Migrate (which also creates the tables of later migrations). Until then the new statements say to migrate; after,
// the records written before keep their leases.
func TestServerUpgrade(t *testing.T) {
	srv := servers[0]
	admin := srv.open(t, "")
	ctx := t.Context()
	name := randomName("idem_upgrade_")
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP SCHEMA "+name+" CASCADE") })
	db := srv.open(t, srv.addrWith(t, func(q url.Values) { q.Set("search_path", name) }, nil))
	s, err := sqlstore.New(db, &sqlstore.Config{Dialect: srv.dialect})
	if err != nil {
		t.Fatal(err)
	}
	r := idem.AcquireRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: long, Retention: long}
	versions := sqlstore.MigrationNames(srv.dialect)
	// Acquire needs every migration up to 3_renewals; the later ones
	// create the tables of other packages (4_tokens, 5_locks).
	const acquireNeeds = 3
	if versions[acquireNeeds-1] != "3_renewals" {
		t.Fatalf("migrations = %v: update acquireNeeds", versions)
	}
	for v := range int64(acquireNeeds - 1) {
		if err := sqlstore.MigrateTo(ctx, s, v+1); err != nil {
			t.Fatalf("migrate to version %d: %v", v+1, err)
		}
		if _, err := s.Acquire(ctx, r); err == nil || !strings.Contains(err.Error(), "Migrate") {
			t.Errorf("Acquire on a version-%d database = %v, want a hint to migrate", v+1, err)
		}
	}
	// Records an older build wrote and extended (it moved lease_until
	// and expires_at of the row): one in flight, one whose lease ended.
	now := time.Now().UnixMilli()
	for _, rec := range []struct {
		key   string
		until int64
	}{{"live", now + time.Hour.Milliseconds()}, {"ended", now - 1000}} {
		if _, err := db.ExecContext(ctx, `INSERT INTO idem_records (scope, idempotency_key, fingerprint, status, owner, fence, lease_until, retention_ms, created_at, expires_at)
			VALUES ('s', $1, 'fp', 'processing', 'old-owner', 3, $2::bigint, 60000, $3::bigint, $2::bigint + 60000)`, rec.key, rec.until, now-5000); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idem_schema_migrations`).Scan(&n); err != nil || n != len(versions) {
		t.Fatalf("versions recorded after the upgrade: %d, %v; want %d", n, err, len(versions))
	}
	live := r
	live.Key = "live"
	if res := mustAcquire(t, s, live, idem.InFlight); res.Record.Owner != "old-owner" || res.Record.LeaseUntil.UnixMilli() != now+time.Hour.Milliseconds() {
		t.Fatalf("the older build's live lease after the upgrade: %+v", res.Record)
	}
	old := idem.Lease{Scope: "s", Key: "live", Owner: "old-owner", Fence: 3}
	ext, err := s.Extend(ctx, old, time.Minute)
	if err != nil {
		t.Fatalf("Extend of the older build's lease: %v", err)
	}
	if rec, err := s.Get(ctx, "s", "live"); err != nil || !rec.LeaseUntil.Equal(ext.Until) || !rec.ExpiresAt.Equal(ext.Until.Add(time.Minute)) {
		t.Fatalf("after Extend: %+v, %v; want lease until %v", rec, err, ext.Until)
	}
	ended := r
	ended.Key = "ended"
	if res := mustAcquire(t, s, ended, idem.Acquired); !res.TookOver || res.Lease.Fence != 4 || !res.Record.CreatedAt.Equal(time.UnixMilli(now-5000)) {
		t.Fatalf("takeover of the older build's ended lease: %+v", res)
	}
	mustAcquire(t, s, r, idem.Acquired)
}

// TestServerClock: the times a record holds are the database's, within
// the test's tolerance of this machine's clock (both run here).
func TestServerClock(t *testing.T) {
	forServers(t, func(t *testing.T, srv server) {
		_, s := srv.setup(t)
		before := time.Now()
		res := mustAcquire(t, s, idem.AcquireRequest{Scope: randomName("clock-"), Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: long}, idem.Acquired)
		if d := res.Lease.Until.Sub(before.Add(time.Minute)); d < -time.Second || d > time.Second {
			t.Fatalf("lease until %v, want about %v", res.Lease.Until, before.Add(time.Minute))
		}
	})
}

// acquireRace: 200 goroutines race Acquire on one key of s, three times
// over: exactly one is told Acquired each time, and none fails.
func acquireRace(t *testing.T, s idem.Store) {
	t.Helper()
	scope := randomName("race-")
	for round := range 3 {
		key := fmt.Sprintf("race-%d", round)
		var acquired, inFlight atomic.Int64
		var errs []error
		var mu sync.Mutex
		race(200, func(int) {
			res, err := s.Acquire(context.Background(), idem.AcquireRequest{Scope: scope, Key: key, Fingerprint: "fp", Lease: long, Retention: long})
			switch {
			case err != nil:
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			case res.Outcome == idem.Acquired:
				acquired.Add(1)
			case res.Outcome == idem.InFlight:
				inFlight.Add(1)
			}
		})
		if len(errs) > 0 {
			t.Fatalf("round %d: %d errors, first: %v", round, len(errs), errs[0])
		}
		if acquired.Load() != 1 || inFlight.Load() != 199 {
			t.Fatalf("round %d: %d acquired, %d in flight; want 1 and 199", round, acquired.Load(), inFlight.Load())
		}
	}
}

// TestServerContextCanceled: a call whose context ended fails with an
// error that matches the context's error.
func TestServerContextCanceled(t *testing.T) {
	forServers(t, func(t *testing.T, srv server) {
		_, s := srv.setup(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		r := idem.AcquireRequest{Scope: randomName("cancel-"), Key: "k", Fingerprint: "fp", Lease: long, Retention: long}
		if _, err := s.Acquire(ctx, r); !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire(canceled) = %v", err)
		}
		if _, err := s.Get(ctx, r.Scope, "k"); !errors.Is(err, context.Canceled) {
			t.Fatalf("Get(canceled) = %v", err)
		}
		if err := s.Migrate(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Migrate(canceled) = %v", err)
		}
	})
}
