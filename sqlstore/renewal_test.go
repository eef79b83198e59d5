package sqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlstore"
)

// renewalStores returns, for each dialect, the stores the renewal races
// run against: on PostgreSQL also stores whose sessions default to
// REPEATABLE READ and SERIALIZABLE, under which a statement's snapshot is
// taken when it starts and not renewed by the statements a function runs.
// With own, the stores work in a schema (PostgreSQL) or database (MySQL)
// of their own, so that their sweeps leave the shared one alone.
func renewalStores(t *testing.T, srv server, own bool) map[string]*sqlstore.Store {
	t.Helper()
	if srv.dialect == sqlstore.SQLite {
		_, s := srv.setup(t)
		return map[string]*sqlstore.Store{"default": s}
	}
	name := ""
	if own {
		admin := srv.open(t, "")
		name = randomName("idem_own_")
		create, drop := "CREATE SCHEMA "+name, "DROP SCHEMA "+name+" CASCADE"
		if srv.dialect == sqlstore.MySQL {
			create, drop = "CREATE DATABASE "+name, "DROP DATABASE "+name
		}
		if _, err := admin.ExecContext(t.Context(), create); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), drop) })
	}
	open := func(level string) *sqlstore.Store {
		addr := srv.addrWith(t, func(q url.Values) {
			if name != "" {
				q.Set("search_path", name)
			}
			if level != "" {
				q.Set("default_transaction_isolation", level)
			}
		}, func(cfg *mysql.Config) {
			if name != "" {
				cfg.DBName = name
			}
		})
		s, err := sqlstore.New(srv.open(t, addr), &sqlstore.Config{Dialect: srv.dialect})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		return s
	}
	stores := map[string]*sqlstore.Store{"default": open("")}
	if srv.dialect == sqlstore.PostgreSQL {
		for _, level := range []string{"repeatable read", "serializable"} {
			stores[level] = open(level)
		}
	}
	return stores
}

// TestExtendTakeoverRace: when a lease has just ended, its owner's Extend
// and another caller's Acquire race. Either the renewal wins (Extend
// succeeds and the Acquire finds the key in flight) or the takeover does
// (the Acquire takes the key and Extend fails with ErrLeaseLost); never
// both, whatever the order the database sees them in.
func TestExtendTakeoverRace(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		for name, s := range renewalStores(t, srv, false) {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				const rounds, lease = 40, 30 * time.Millisecond
				scope := randomName("extrace-")
				var extended, tookOver int
				for round := range rounds {
					r := idem.AcquireRequest{Scope: scope, Key: fmt.Sprint(round), Fingerprint: "fp", Lease: lease, Retention: long}
					l := mustAcquire(t, s, r, idem.Acquired).Lease
					time.Sleep(time.Until(l.Until) + time.Duration(round%5)*time.Millisecond)
					var extErr error
					var res idem.AcquireResult
					var acqErr error
					race(2, func(i int) {
						if i == 0 {
							_, extErr = s.Extend(t.Context(), l, long)
							return
						}
						r := r
						r.Lease = long
						res, acqErr = s.Acquire(t.Context(), r)
					})
					if acqErr != nil {
						t.Fatalf("round %d: Acquire: %v", round, acqErr)
					}
					if extErr != nil && !errors.Is(extErr, idem.ErrLeaseLost) {
						t.Fatalf("round %d: Extend: %v", round, extErr)
					}
					rec, err := s.Get(t.Context(), r.Scope, r.Key)
					if err != nil {
						t.Fatal(err)
					}
					switch {
					case extErr == nil && res.Outcome == idem.Acquired:
						t.Fatalf("round %d: both the renewal and the takeover succeeded: two owners (record %+v)", round, rec)
					case extErr == nil:
						extended++
						if res.Outcome != idem.InFlight || rec.Owner != l.Owner || time.Until(rec.LeaseUntil) < long/2 {
							t.Fatalf("round %d: the renewal won, but Acquire = %v and the record is %+v", round, res.Outcome, rec)
						}
					case res.Outcome == idem.Acquired:
						tookOver++
						if rec.Owner != res.Lease.Owner || rec.Fence != l.Fence+1 {
							t.Fatalf("round %d: the takeover won, but the record is %+v", round, rec)
						}
					default:
						t.Fatalf("round %d: neither won: Extend %v, Acquire %v", round, extErr, res.Outcome)
					}
				}
				t.Logf("%d rounds: %d renewals won, %d takeovers won", rounds, extended, tookOver)
			})
		}
	})
}

// TestExtendSweepRace: a record whose lease and retention have both run
// out may be swept, but not once its owner's Extend succeeded: either
// Sweep removes it (and Extend fails with ErrLeaseLost) or Extend renews
// it (and the record stays).
func TestExtendSweepRace(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		for name, s := range renewalStores(t, srv, true) {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				const rounds, lease, retention = 20, 20 * time.Millisecond, 10 * time.Millisecond
				scope := randomName("sweeprace-")
				for round := range rounds {
					r := idem.AcquireRequest{Scope: scope, Key: fmt.Sprint(round), Fingerprint: "fp", Lease: lease, Retention: retention}
					if round%2 == 1 {
						// Half of them renewed once before: the renewal is
						// what expires. They are acquired for long, so that
						// no Sweep (another case's runs in parallel) can
						// remove them before that renewal, however late it
						// comes on a loaded machine.
						r.Lease = long
					}
					l := mustAcquire(t, s, r, idem.Acquired).Lease
					if round%2 == 1 {
						var err error
						if l, err = s.Extend(t.Context(), l, lease); err != nil {
							t.Fatal(err)
						}
					}
					time.Sleep(time.Until(l.Until.Add(retention)) + time.Duration(round%4)*time.Millisecond)
					var extErr, sweepErr error
					race(2, func(i int) {
						if i == 0 {
							_, extErr = s.Extend(t.Context(), l, long)
							return
						}
						_, sweepErr = s.Sweep(t.Context(), 1000)
					})
					if sweepErr != nil {
						t.Fatalf("round %d: Sweep: %v", round, sweepErr)
					}
					rec, err := s.Get(t.Context(), r.Scope, r.Key)
					switch {
					case extErr == nil && err != nil:
						t.Fatalf("round %d: Extend succeeded but the record is gone: %v", round, err)
					case extErr == nil && (rec.Owner != l.Owner || time.Until(rec.LeaseUntil) < long/2):
						t.Fatalf("round %d: Extend succeeded but the record is %+v", round, rec)
					case extErr != nil && !errors.Is(extErr, idem.ErrLeaseLost):
						t.Fatalf("round %d: Extend: %v", round, extErr)
					case extErr != nil && !errors.Is(err, idem.ErrNotFound):
						t.Fatalf("round %d: Extend lost its lease, yet the record is %+v, %v", round, rec, err)
					}
				}
			})
		}
	})
}
