package sqlstore_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/sqlstore"
)

// viaProxy returns a store over the server reached through a proxy the
// test controls, and the proxy.
// On MySQL the store works in database dbName.
func (srv server) viaProxy(t *testing.T, dbName string) (*sqlstore.Store, *netfault.Proxy) {
	t.Helper()
	addr := srv.svc.Need(t)
	var host string
	switch srv.dialect {
	case sqlstore.PostgreSQL:
		u, err := url.Parse(addr)
		if err != nil {
			t.Fatal(err)
		}
		host = u.Host
	case sqlstore.MySQL:
		cfg, err := mysql.ParseDSN(addr)
		if err != nil {
			t.Fatal(err)
		}
		host = cfg.Addr
	}
	proxy, err := netfault.New(host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	switch srv.dialect {
	case sqlstore.PostgreSQL:
		u, _ := url.Parse(addr)
		u.Host = proxy.Addr()
		addr = u.String()
	case sqlstore.MySQL:
		cfg, _ := mysql.ParseDSN(addr)
		cfg.Addr = proxy.Addr()
		cfg.DBName = dbName
		addr = cfg.FormatDSN()
	}
	s, err := sqlstore.New(srv.open(t, addr), &sqlstore.Config{Dialect: srv.dialect})
	if err != nil {
		t.Fatal(err)
	}
	return s, proxy
}

// TestCompleteReplyLost: a completion commits on the server but its
// reply never reaches the store (the network stalls in between, and the
// call ends with its context); the retry, on a new connection, succeeds
// without writing, and the record keeps the first response. The commit is
// held back by a row lock the test holds, so that the stall surely comes
// before the reply.
func TestCompleteReplyLost(t *testing.T) {
	forServers(t, func(t *testing.T, srv server) {
		admin, direct := srv.setup(t)
		dbName := ""
		if srv.dialect == sqlstore.MySQL {
			// A database of its own, in which the test can tell the
			// completion's session from every other test's.
			dbName = randomName("idem_lost_")
			if _, err := admin.ExecContext(t.Context(), "CREATE DATABASE "+dbName); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP DATABASE "+dbName) })
			admin = srv.open(t, srv.addrWith(t, nil, func(cfg *mysql.Config) { cfg.DBName = dbName }))
			var err error
			if direct, err = sqlstore.New(admin, &sqlstore.Config{Dialect: srv.dialect}); err != nil {
				t.Fatal(err)
			}
			if err := direct.Migrate(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		for _, op := range []string{"complete", "complete record"} {
			t.Run(op, func(t *testing.T) {
				s, proxy := srv.viaProxy(t, dbName)
				ctx := t.Context()
				r := idem.AcquireRequest{Scope: randomName("lost-"), Key: "k", Fingerprint: "fp", Lease: long, Retention: long}
				l := mustAcquire(t, s, r, idem.Acquired).Lease
				complete := func(ctx context.Context, body string) error {
					resp := idem.Response{StatusCode: 201, Header: map[string][]string{"X": {body}}, Body: []byte(body)}
					if op == "complete" {
						return s.Complete(ctx, l, resp, long)
					}
					rec, err := s.CompleteRecord(ctx, l, resp, long)
					if err == nil && (rec.Status != idem.StatusCompleted || string(rec.Response.Body) != "first") {
						t.Errorf("CompleteRecord returned %+v, want the first completion", rec)
					}
					return err
				}
				// Warm the connection and the statement.
				if _, err := s.Get(ctx, r.Scope, r.Key); err != nil {
					t.Fatal(err)
				}
				blocker, err := admin.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer blocker.Rollback()
				if _, err := blocker.ExecContext(ctx, srv.rebind(`SELECT fence FROM idem_records WHERE scope = ? AND idempotency_key = ? FOR UPDATE`), r.Scope, r.Key); err != nil {
					t.Fatal(err)
				}
				var pid int64
				if srv.dialect == sqlstore.PostgreSQL {
					if err := blocker.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
						t.Fatal(err)
					}
				}
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				done := make(chan error, 1)
				go func() { done <- complete(cctx, "first") }()
				// Until the completion waits for the row (it has reached the
				// server), then stall the network and let it commit. (On
				// MySQL, the look-up in PROCESSLIST must not count itself:
				// its own text holds the pattern.)
				deadline := time.Now().Add(10 * time.Second)
				for {
					if time.Now().After(deadline) {
						t.Fatal("the completion never waited for the row")
					}
					var waiting int
					var err error
					if srv.dialect == sqlstore.PostgreSQL {
						err = admin.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, pid).Scan(&waiting)
					} else {
						err = admin.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = ? AND INFO LIKE '%UPDATE idem_records%' AND COMMAND = 'Execute' AND ID <> CONNECTION_ID()`, dbName).Scan(&waiting)
					}
					if err != nil {
						t.Fatal(err)
					}
					if waiting > 0 {
						break
					}
					select {
					case err := <-done:
						t.Fatalf("the completion returned before it could commit: %v", err)
					case <-time.After(5 * time.Millisecond):
					}
				}
				proxy.Stall()
				if err := blocker.Commit(); err != nil {
					t.Fatal(err)
				}
				// The completion commits now; its reply is stalled.
				for {
					if time.Now().After(deadline) {
						t.Fatal("the completion never committed")
					}
					rec, err := direct.Get(ctx, r.Scope, r.Key)
					if err != nil {
						t.Fatal(err)
					}
					if rec.Status == idem.StatusCompleted {
						break
					}
					time.Sleep(5 * time.Millisecond)
				}
				if err := <-done; err == nil {
					t.Fatal("the completion whose reply was stalled succeeded")
				}
				proxy.Drop()
				proxy.Resume()
				if err := complete(ctx, "retry"); err != nil {
					t.Fatalf("retried %s after a lost reply: %v", op, err)
				}
				rec, err := direct.Get(ctx, r.Scope, r.Key)
				if err != nil || rec.Status != idem.StatusCompleted || rec.Owner != l.Owner || string(rec.Response.Body) != "first" || rec.Response.Header["X"][0] != "first" {
					t.Fatalf("record = %+v, %v; want the first completion", rec, err)
				}
			})
		}
	})
}
