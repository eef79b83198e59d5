package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/steps/stepstest"
	"github.com/idemkit/idem/storetest"
	"github.com/idemkit/idem/token"
	"github.com/idemkit/idem/token/tokentest"
)

// mysqlServer is the MySQL/MariaDB entry of servers.
var mysqlServer = func() server {
	for _, srv := range servers {
		if srv.dialect == sqlstore.MySQL {
			return srv
		}
	}
	panic("no MySQL server")
}()

// mysqlModes are session sql_modes the MySQL dialect must work under,
// whatever the server's default. SIMULTANEOUS_ASSIGNMENT (MariaDB 10.3+,
// also part of ORACLE) makes every right-hand side of an UPDATE or an ON
// DUPLICATE KEY UPDATE read the row as it was; ORACLE changes the parser
// (ANSI_QUOTES, PIPES_AS_CONCAT, IGNORE_SPACE, …); ANSI and the flags after
// it change how quotes, || and backslashes read; the last mixes them with
// the strict modes. A mode the server does not know (MySQL has neither
// SIMULTANEOUS_ASSIGNMENT nor ORACLE) skips. EMPTY_STRING_IS_NULL
// (MariaDB 10.3+) turns an empty string bound to a statement into NULL:
// the empty scope and the empty fingerprint must still be stored and
// found.
// The last also sets clientFoundRows, under which an upsert that changes
// nothing reports one affected row, as an insert does.
var mysqlModes = []mysqlSession{
	{mode: "SIMULTANEOUS_ASSIGNMENT"},
	{mode: "ORACLE"},
	{mode: "ANSI"},
	{mode: "PIPES_AS_CONCAT,ANSI_QUOTES,NO_BACKSLASH_ESCAPES"},
	{mode: "TRADITIONAL,ANSI,NO_BACKSLASH_ESCAPES,HIGH_NOT_PRECEDENCE,SIMULTANEOUS_ASSIGNMENT", foundRows: true},
	{mode: "EMPTY_STRING_IS_NULL"},
	{mode: "ORACLE,EMPTY_STRING_IS_NULL"},
}

// mysqlSession is how a test's connections set up their sessions.
type mysqlSession struct {
	mode      string // sql_mode; empty: the server's default
	foundRows bool   // the DSN's clientFoundRows
}

func (m mysqlSession) String() string {
	name := m.mode
	if name == "" {
		name = "server default"
	}
	if m.foundRows {
		name += "+clientFoundRows"
	}
	return name
}

// openMySQLMode opens the MySQL test database (database dbName when not
// empty) with every connection's session set up as m says, and checks
// that its sql_mode holds.
func openMySQLMode(t *testing.T, m mysqlSession, dbName string) *sql.DB {
	t.Helper()
	srv := mysqlServer
	srv.svc.Need(t)
	addr := srv.addrWith(t, nil, func(cfg *mysql.Config) {
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		if m.mode != "" {
			cfg.Params["sql_mode"] = "'" + m.mode + "'"
		}
		cfg.ClientFoundRows = m.foundRows
		if dbName != "" {
			cfg.DBName = dbName
		}
	})
	db, err := sql.Open(srv.driver, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	// Small: every mode of mysqlModes and lockModes runs at once, beside
	// the other test packages, within MariaDB's default 151 connections.
	db.SetMaxOpenConns(4)
	db.SetMaxIdleConns(4)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var got, version string
	err = db.QueryRowContext(ctx, "SELECT @@SESSION.sql_mode, VERSION()").Scan(&got, &version)
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) && myErr.Number == 1231 { // ER_WRONG_VALUE_FOR_VAR
		t.Skipf("the server does not know sql_mode %s: %v", m.mode, err)
	}
	if err != nil {
		t.Fatalf("session %s: %v", m, err)
	}
	t.Logf("%s, session sql_mode %s", version, got)
	have := strings.Split(got, ",")
	for _, flag := range strings.Split(m.mode, ",") {
		if flag != "" && !slices.Contains(have, flag) {
			t.Fatalf("session sql_mode = %q, want it to include %s", got, flag)
		}
	}
	return db
}

// dbNow returns the database's clock, as the MySQL dialect's statements
// read it.
func dbNow(t *testing.T, db *sql.DB) time.Time {
	t.Helper()
	var ms int64
	if err := db.QueryRowContext(t.Context(), `SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000`).Scan(&ms); err != nil {
		t.Fatal(err)
	}
	return time.UnixMilli(ms).UTC()
}

// TestMySQLModeAcquire: under any session sql_mode, a takeover of an
// ended lease moves owner, fence and lease together and keeps created_at,
// so that the next caller finds the key in flight; an expired completed
// record and an abandoned (expired) processing record are replaced by a
// new record created at the database's now. With SIMULTANEOUS_ASSIGNMENT
// an upsert that relies on left-to-right assignment moves only the owner.
func TestMySQLModeAcquire(t *testing.T) {
	t.Parallel()
	for _, m := range append([]mysqlSession{{}}, mysqlModes...) {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			db := openMySQLMode(t, m, "")
			s, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.MySQL})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(t.Context()); err != nil {
				t.Fatalf("Migrate: %v", err)
			}
			mysqlAcquireCases(t, db, s)
		})
	}
}

func mysqlAcquireCases(t *testing.T, db *sql.DB, s *sqlstore.Store) {
	ctx := t.Context()
	scope := randomName("mode-")
	get := func(key string) idem.Record {
		t.Helper()
		rec, err := s.Get(ctx, scope, key)
		if err != nil {
			t.Fatalf("Get(%q): %v", key, err)
		}
		return rec
	}
	// fresh checks that res holds key under a new record that the
	// database created between t0 and t1.
	fresh := func(key string, res idem.AcquireResult, req idem.AcquireRequest, fence int64, t0, t1 time.Time) {
		t.Helper()
		rec := get(key)
		if rec.Owner != res.Lease.Owner || rec.Fence != fence || res.Lease.Fence != fence || rec.Status != idem.StatusProcessing ||
			rec.Fingerprint != req.Fingerprint || rec.Response != nil || !rec.CompletedAt.IsZero() ||
			!rec.LeaseUntil.Equal(res.Lease.Until) || !rec.ExpiresAt.Equal(rec.LeaseUntil.Add(req.Retention)) || rec.Retention != req.Retention {
			t.Fatalf("record after the replacement = %+v; want it held by %+v", rec, res.Lease)
		}
		if rec.CreatedAt.Before(t0) || rec.CreatedAt.After(t1) || !rec.CreatedAt.Equal(rec.LeaseUntil.Add(-req.Lease)) {
			t.Fatalf("replaced record created at %v, lease until %v; want the database's now at the replacement (between %v and %v)", rec.CreatedAt, rec.LeaseUntil, t0, t1)
		}
		if !res.Record.CreatedAt.Equal(rec.CreatedAt) || res.Record.Fence != fence {
			t.Fatalf("Acquire's record = %+v, Get's = %+v", res.Record, rec)
		}
	}

	// A takeover of an ended lease: fence + 1, a live lease, created_at
	// kept, and nobody else gets the key.
	r := idem.AcquireRequest{Scope: scope, Key: "k", Fingerprint: "fp", Lease: short, Retention: long}
	first := mustAcquire(t, s, r, idem.Acquired)
	before := get("k")
	time.Sleep(short + 20*time.Millisecond)
	r.Lease = long
	second := mustAcquire(t, s, r, idem.Acquired)
	if !second.TookOver || second.Lease.Fence != first.Lease.Fence+1 || second.Lease.Owner == first.Lease.Owner {
		t.Fatalf("takeover = %+v; want TookOver, fence %d and a new owner", second, first.Lease.Fence+1)
	}
	rec := get("k")
	if rec.Owner != second.Lease.Owner || rec.Fence != second.Lease.Fence || !rec.LeaseUntil.Equal(second.Lease.Until) ||
		!rec.CreatedAt.Equal(before.CreatedAt) || !rec.ExpiresAt.Equal(rec.LeaseUntil.Add(long)) || rec.Status != idem.StatusProcessing {
		t.Fatalf("record after the takeover = %+v (before: %+v); want owner, fence and lease of %+v, created_at kept", rec, before, second.Lease)
	}
	if res := mustAcquire(t, s, r, idem.InFlight); res.Record.Owner != second.Lease.Owner {
		t.Fatalf("Acquire after the takeover sees owner %q, want %q", res.Record.Owner, second.Lease.Owner)
	}
	if err := s.Complete(ctx, first.Lease, idem.Response{StatusCode: 200}, long); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Complete with the taken-over lease = %v, want ErrLeaseLost", err)
	}
	if err := s.Complete(ctx, second.Lease, idem.Response{StatusCode: 201, Header: map[string][]string{"Location": {"/x"}}, Body: []byte("b")}, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}

	// An expired completed record is replaced, whatever the fingerprint.
	time.Sleep(70 * time.Millisecond)
	other := r
	other.Fingerprint = "other"
	t0 := dbNow(t, db)
	third := mustAcquire(t, s, other, idem.Acquired)
	t1 := dbNow(t, db)
	if third.TookOver {
		t.Fatalf("replacement of a completed record = %+v, want not TookOver", third)
	}
	fresh("k", third, other, second.Lease.Fence+1, t0, t1)
	mustAcquire(t, s, other, idem.InFlight)

	// An abandoned processing record, past its expiry, is replaced as
	// well: a new record (created now), reported as a takeover.
	ab := idem.AcquireRequest{Scope: scope, Key: "abandoned", Fingerprint: "fp", Lease: short, Retention: 50 * time.Millisecond}
	old := mustAcquire(t, s, ab, idem.Acquired)
	time.Sleep(short + 70*time.Millisecond)
	ab2 := ab
	ab2.Fingerprint, ab2.Lease, ab2.Retention = "other", long, long
	t0 = dbNow(t, db)
	res := mustAcquire(t, s, ab2, idem.Acquired)
	t1 = dbNow(t, db)
	if !res.TookOver || res.Lease.Owner == old.Lease.Owner {
		t.Fatalf("replacement of an abandoned record = %+v, want TookOver and a new owner", res)
	}
	fresh("abandoned", res, ab2, old.Lease.Fence+1, t0, t1)
	mustAcquire(t, s, ab2, idem.InFlight)
	if err := s.Complete(ctx, old.Lease, idem.Response{StatusCode: 200}, long); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Complete with the abandoned lease = %v, want ErrLeaseLost", err)
	}
}

// TestMySQLModeConformance runs the conformance suites of records, of
// tokens (the fingerprint, the keep and the two-statement Trim) and of
// package steps' journal (the empty scope under EMPTY_STRING_IS_NULL, a
// duplicate checkpoint told apart from a new one under clientFoundRows),
// and Migrate, in a database of its own
// under each session sql_mode of mysqlModes.
func TestMySQLModeConformance(t *testing.T) {
	t.Parallel()
	for _, m := range mysqlModes {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			db := openMySQLModeDB(t, m)
			s, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.MySQL})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(t.Context()); err != nil {
				t.Fatalf("Migrate under %s: %v", m, err)
			}
			storetest.Run(t, func(*testing.T) idem.Store { return s }, storetest.Caps{
				BeginTx:   func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
				Precision: time.Millisecond,
			})
			ts := newTokenStore(t, db, sqlstore.MySQL)
			tokentest.Run(t, func(*testing.T) token.Store { return ts }, tokentest.Caps{
				BeginTx:   func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
				Precision: time.Millisecond,
			})
			j, err := sqlstore.NewStepJournal(db, &sqlstore.Config{Dialect: sqlstore.MySQL})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = j.Close() })
			stepstest.Run(t, func(*testing.T) stepstest.Setup { return stepstest.Setup{Store: s, Journal: j, DB: db} })
		})
	}
}

// TestMySQLModeOutbox: under each session sql_mode of mysqlModes, the
// migration that adds msg_id runs on a table with a pending row of an
// older build, and again after an interruption (its version not
// recorded); then a message with an empty key and no payload is added
// beside a keyed one, and every row is claimed with its ID. Under
// EMPTY_STRING_IS_NULL, the empty key and payload used to be bound as
// NULL, and Add failed ("Column 'msg_key' cannot be null").
func TestMySQLModeOutbox(t *testing.T) {
	t.Parallel()
	for _, m := range mysqlModes {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db := openMySQLModeDB(t, m)
			old, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.MySQL})
			if err != nil {
				t.Fatal(err)
			}
			version := msgIDVersion(t, sqlstore.MySQL)
			if err := sqlstore.MigrateTo(ctx, old, version-1); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, `INSERT INTO idem_outbox (topic, msg_key, payload, created_at) VALUES (?, ?, ?, 1)`, "order.paid", "o-1", []byte("p")); err != nil {
				t.Fatal(err)
			}
			s := newOutboxStore(t, db, sqlstore.OutboxConfig{Dialect: sqlstore.MySQL, IDPrefix: "eu/"})
			if _, err := db.ExecContext(ctx, `DELETE FROM idem_schema_migrations WHERE version = ?`, version); err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("Migrate again after an interruption: %v", err)
			}
			added, err := addTx(ctx, db, s, false, outbox.Message{Topic: "order.paid"}, outbox.Message{Topic: "order.paid", Key: "o-2", Payload: []byte("q")})
			if err != nil {
				t.Fatalf("Add: %v", err)
			}
			if got, want := claimAll(t, s, true), append([]string{"eu/1"}, added...); !slices.Equal(got, want) {
				t.Fatalf("Claim = %q, want %q", got, want)
			}
			if n := pendingCount(t, db); n != 0 {
				t.Fatalf("%d pending, want 0", n)
			}
		})
	}
}

// openMySQLModeDB opens a database of its own, dropped when t ends, with
// every connection's session set up as m says.
func openMySQLModeDB(t *testing.T, m mysqlSession) *sql.DB {
	t.Helper()
	admin := mysqlServer.open(t, "")
	name := randomName("idem_mode_")
	if _, err := admin.ExecContext(t.Context(), "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	admin.SetMaxIdleConns(0) // used again only to drop the database
	t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP DATABASE "+name) })
	return openMySQLMode(t, m, name)
}
