package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlstore"
)

// TestCompleteTxOnePool: CompleteTx in a transaction of the store's own
// *sql.DB, whose pool allows one connection (the transaction holds it),
// answers at once when the record is no longer the lease's: ErrLeaseLost
// after a takeover, ErrFinished after the lease's own completion, under
// every isolation level. Explaining the refusal on another connection of
// the pool would wait for the transaction's own connection until the
// context ends.
func TestCompleteTxOnePool(t *testing.T) {
	forServers(t, func(t *testing.T, srv server) {
		db, other, s := srv.setupTwo(t)
		srv.table(t, db, "idem_test_orders")
		db.SetMaxOpenConns(1)
		s2, err := sqlstore.New(other, &sqlstore.Config{Dialect: srv.dialect})
		if err != nil {
			t.Fatal(err)
		}
		for _, level := range isolationLevels {
			for _, tc := range []struct {
				name string
				want error
			}{{"takeover", idem.ErrLeaseLost}, {"completed", idem.ErrFinished}} {
				t.Run(level.String()+"/"+tc.name, func(t *testing.T) {
					// Not parallel: the store's pool has one connection.
					r := idem.AcquireRequest{Scope: randomName("onepool-"), Key: "k", Fingerprint: "fp", Lease: short, Retention: long}
					stale := mustAcquire(t, s, r, idem.Acquired).Lease
					// Prepare the statements CompleteTx uses before the
					// transaction holds the only connection, as a running
					// service would have.
					if _, err := s.Get(t.Context(), r.Scope, r.Key); err != nil {
						t.Fatal(err)
					}
					ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
					defer cancel()
					tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
					if err != nil {
						t.Fatal(err)
					}
					defer tx.Rollback()
					srv.business(t, tx, r.Scope)
					var n int
					if err := tx.QueryRowContext(ctx, srv.rebind(`SELECT count(*) FROM idem_test_orders WHERE id = ?`), r.Scope).Scan(&n); err != nil {
						t.Fatal(err)
					}
					var won idem.Lease
					switch tc.name {
					case "takeover":
						time.Sleep(short + 20*time.Millisecond)
						r.Lease = long
						won = mustAcquire(t, s2, r, idem.Acquired).Lease
					case "completed":
						if err := s2.Complete(ctx, stale, idem.Response{StatusCode: 201, Body: []byte("first")}, long); err != nil {
							t.Fatal(err)
						}
					}
					err = s.CompleteTx(ctx, tx, stale, idem.Response{StatusCode: 201, Body: []byte("stale")}, long)
					if ctx.Err() != nil {
						t.Fatalf("CompleteTx under %v waited until its context ended: %v", level, err)
					}
					if !errors.Is(err, tc.want) {
						t.Fatalf("CompleteTx under %v = %v, want %v", level, err, tc.want)
					}
					_ = tx.Rollback()
					if n := srv.businessRows(t, db, r.Scope); n != 0 {
						t.Fatalf("%d business rows, want 0", n)
					}
					rec, err := s2.Get(t.Context(), r.Scope, r.Key)
					switch {
					case err != nil:
						t.Fatal(err)
					case tc.name == "takeover" && (rec.Status != idem.StatusProcessing || rec.Owner != won.Owner):
						t.Fatalf("record = %+v, want the winner's", rec)
					case tc.name == "completed" && (rec.Status != idem.StatusCompleted || string(rec.Response.Body) != "first"):
						t.Fatalf("record = %+v, want the first completion", rec)
					}
				})
			}
		}
	})
}
