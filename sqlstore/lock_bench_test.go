package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/benchpair"
	"github.com/idemkit/idem/lock"
)

var bareTable = map[string]string{
	"sqlite":   `CREATE TABLE bare_locks (name TEXT PRIMARY KEY, owner TEXT NOT NULL) STRICT`,
	"postgres": `CREATE TABLE bare_locks (name text PRIMARY KEY, owner text NOT NULL)`,
	"mysql":    `CREATE TABLE bare_locks (name VARBINARY(255) PRIMARY KEY, owner VARBINARY(64) NOT NULL) ENGINE = InnoDB`,
}

// BenchmarkLockVsRoundTrip measures an acquisition and release of a
// lock, interleaved in one loop (benchpair.Run) with the bare statements
// a hand-made lock would run on the same database: INSERT of a row
// keyed by the name, then DELETE of it by name and owner.
//
//   - backend: LockBackend.Acquire + Release (two statements);
//   - locker: Locker.TryAcquire + Lease.Release, the same two statements
//     plus the lease's watchdog timer and contexts;
//   - bare: the raw INSERT + DELETE, prepared.
//
// Ratios x-bare are the lock's cost in multiples of the bare pair.
//
//	go test -run '^$' -bench LockVsRoundTrip -benchtime 2000x -count 3 ./sqlstore/
func BenchmarkLockVsRoundTrip(b *testing.B) {
	forEachBench := func(srv server) {
		b.Run(srv.dialect.String(), func(b *testing.B) {
			ctx := context.Background()
			db, _ := lockDB(b, srv)
			if _, err := db.ExecContext(ctx, bareTable[srv.dialect.String()]); err != nil {
				b.Fatal(err)
			}
			backend := newLockBackend(b, db, srv.dialect)
			locker, err := lock.New(backend, &lock.Config{TTL: time.Minute})
			if err != nil {
				b.Fatal(err)
			}
			ins, err := db.PrepareContext(ctx, srv.rebind("INSERT INTO bare_locks (name, owner) VALUES (?, ?)"))
			if err != nil {
				b.Fatal(err)
			}
			defer ins.Close()
			del, err := db.PrepareContext(ctx, srv.rebind("DELETE FROM bare_locks WHERE name = ? AND owner = ?"))
			if err != nil {
				b.Fatal(err)
			}
			defer del.Close()
			m := benchpair.Run(b,
				benchpair.Func{Name: "backend", F: func() {
					o := lock.NewOwner()
					f, err := backend.Acquire(ctx, "bench-backend", o, time.Minute)
					if err != nil {
						b.Fatal(err)
					}
					if err := backend.Release(ctx, "bench-backend", o, f); err != nil {
						b.Fatal(err)
					}
				}},
				benchpair.Func{Name: "locker", F: func() {
					l, err := locker.TryAcquire(ctx, "bench-locker")
					if err != nil {
						b.Fatal(err)
					}
					if err := l.Release(ctx); err != nil {
						b.Fatal(err)
					}
				}},
				benchpair.Func{Name: "bare", F: func() {
					o := lock.NewOwner()
					if _, err := ins.ExecContext(ctx, "bench-bare", o); err != nil {
						b.Fatal(err)
					}
					if _, err := del.ExecContext(ctx, "bench-bare", o); err != nil {
						b.Fatal(err)
					}
				}},
			)
			benchpair.Ratio(b, "backend-x-bare", m[0], m[2])
			benchpair.Ratio(b, "locker-x-bare", m[1], m[2])
		})
	}
	forEachBench(sqliteServer)
	for _, srv := range servers {
		forEachBench(srv)
	}
}
