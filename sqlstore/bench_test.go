package sqlstore_test

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/benchpair"
	"github.com/idemkit/idem/internal/throughput"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

// The single-goroutine benchmarks measure one call, on SQLite (a file
// database opened by sqlite.Open: WAL, synchronous=FULL, every commit
// fsynced) and on each server (skipped when it is unreachable).
// BaselineSelect1 and BaselineInsert put them in proportion: a prepared
// SELECT 1 (one round trip), and a raw one-row INSERT in its own
// transaction (one round trip and one durable commit) on the same
// database.
//
//	go test -run '^$' -bench 'AcquireNew|Complete$|Replay|Baseline' -benchmem -count 3 ./sqlstore/
//
// Separate benchmarks run minutes apart on a machine whose round trip
// drifts, so their ratios swing; BenchmarkVsRoundTrip measures each
// operation interleaved with its baselines in one loop (see
// internal/benchpair) and reports the ratios of the same run.

var benchResp = idem.Response{
	StatusCode: 201,
	Header:     map[string][]string{"Content-Type": {"application/json"}},
	Body:       []byte(`{"id":"ord_123","amount":4200,"currency":"EUR"}`),
}

// benchTarget is one database the benchmarks run on.
type benchTarget struct {
	db    *sql.DB
	s     *sqlstore.Store
	srv   *server // nil for SQLite
	scope string  // fresh for each benchmark: servers keep their rows
}

func (bt benchTarget) req(key string) idem.AcquireRequest {
	return idem.AcquireRequest{Scope: bt.scope, Key: key, Fingerprint: "fp", Lease: long, Retention: long}
}

// forTargets runs f as a sub-benchmark on SQLite and on each server.
func forTargets(b *testing.B, f func(b *testing.B, bt benchTarget)) {
	b.Run("sqlite", func(b *testing.B) {
		db, s := setup(b)
		f(b, benchTarget{db: db, s: s, scope: "tenant"})
	})
	for _, srv := range servers {
		b.Run(srv.dialect.String(), func(b *testing.B) {
			db, s := srv.setup(b)
			bt := benchTarget{db: db, s: s, srv: &srv, scope: randomName("bench-")}
			b.Cleanup(func() {
				_, _ = db.ExecContext(context.Background(), srv.rebind(`DELETE FROM idem_records WHERE scope = ?`), bt.scope)
			})
			f(b, bt)
		})
	}
}

func BenchmarkAcquireNew(b *testing.B) {
	forTargets(b, func(b *testing.B, bt benchTarget) {
		ctx := context.Background()
		for i := 0; b.Loop(); i++ {
			if _, err := bt.s.Acquire(ctx, bt.req(fmt.Sprint("k", i))); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkComplete(b *testing.B) {
	forTargets(b, func(b *testing.B, bt benchTarget) {
		ctx := context.Background()
		next := leaseBatches(b, bt)
		for b.Loop() {
			if err := bt.s.Complete(ctx, next(), benchResp, long); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// leaseBatches returns a function that hands out a lease of a new key of
// bt at each call. It acquires them 1024 at a time, with b's timer
// stopped, and hands out the last acquired first.
func leaseBatches(b *testing.B, bt benchTarget) func() idem.Lease {
	ctx := context.Background()
	leases := make([]idem.Lease, 0, 1024)
	return func() idem.Lease {
		if len(leases) == 0 {
			b.StopTimer()
			for range cap(leases) {
				res, err := bt.s.Acquire(ctx, bt.req("lease"+strconv.FormatInt(throughput.Next(), 10)))
				if err != nil || res.Outcome != idem.Acquired {
					b.Fatal(res.Outcome, err)
				}
				leases = append(leases, res.Lease)
			}
			b.StartTimer()
		}
		l := leases[len(leases)-1]
		leases = leases[:len(leases)-1]
		return l
	}
}

// completed acquires key of bt and completes it with benchResp.
func completed(b *testing.B, bt benchTarget, key string) {
	b.Helper()
	ctx := context.Background()
	res, err := bt.s.Acquire(ctx, bt.req(key))
	if err != nil || res.Outcome != idem.Acquired {
		b.Fatal(res.Outcome, err)
	}
	if err := bt.s.Complete(ctx, res.Lease, benchResp, long); err != nil {
		b.Fatal(err)
	}
}

func BenchmarkReplay(b *testing.B) {
	forTargets(b, func(b *testing.B, bt benchTarget) {
		ctx := context.Background()
		completed(b, bt, "k")
		for b.Loop() {
			res, err := bt.s.Acquire(ctx, bt.req("k"))
			if err != nil || res.Outcome != idem.Completed {
				b.Fatal(res.Outcome, err)
			}
		}
	})
}

func BenchmarkBaselineSelect1(b *testing.B) {
	forTargets(b, func(b *testing.B, bt benchTarget) {
		sel := select1(b, bt)
		for b.Loop() {
			sel()
		}
	})
}

func BenchmarkBaselineInsert(b *testing.B) {
	forTargets(b, func(b *testing.B, bt benchTarget) {
		ins := rawInsert(b, bt)
		for b.Loop() {
			ins()
		}
	})
}

// select1 prepares SELECT 1 on bt's database and returns a call of it,
// which fails b on an error.
func select1(b *testing.B, bt benchTarget) func() {
	b.Helper()
	ctx := context.Background()
	stmt, err := bt.db.PrepareContext(ctx, "SELECT 1")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = stmt.Close() })
	var one int
	return func() {
		if err := stmt.QueryRowContext(ctx).Scan(&one); err != nil {
			b.Fatal(err)
		}
	}
}

// rawInsert prepares the raw one-row INSERT (prepareRawInsert) and returns
// a call of it that inserts a new row each time, and fails b on an error.
// The rows are deleted when b ends.
func rawInsert(b *testing.B, bt benchTarget) func() {
	b.Helper()
	ctx := context.Background()
	stmt := prepareRawInsert(b, bt)
	b.Cleanup(func() { _ = stmt.Close() })
	prefix := randomName("")
	if bt.srv != nil {
		b.Cleanup(func() {
			_, _ = bt.db.ExecContext(context.Background(), bt.srv.rebind(`DELETE FROM idem_bench_insert WHERE k LIKE ?`), prefix+"%")
		})
	}
	i := 0
	return func() {
		i++
		if _, err := stmt.ExecContext(ctx, prefix+strconv.Itoa(i), benchResp.Body); err != nil {
			b.Fatal(err)
		}
	}
}

// prepareRawInsert prepares a raw one-row INSERT of a key and a value, in
// its own transaction, into a table of its own (created unless it
// exists): one round trip and one durable commit.
func prepareRawInsert(b *testing.B, bt benchTarget) *sql.Stmt {
	b.Helper()
	ctx := context.Background()
	ddl, table := `CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v BLOB)`, "t"
	if bt.srv != nil {
		table = "idem_bench_insert"
		ddl = map[string]string{
			"postgres": `CREATE TABLE IF NOT EXISTS idem_bench_insert (k text PRIMARY KEY, v bytea)`,
			"mysql":    `CREATE TABLE IF NOT EXISTS idem_bench_insert (k VARBINARY(255) PRIMARY KEY, v LONGBLOB) ENGINE = InnoDB`,
		}[bt.srv.dialect.String()]
	}
	if _, err := bt.db.ExecContext(ctx, ddl); err != nil {
		b.Fatal(err)
	}
	q := `INSERT INTO ` + table + ` (k, v) VALUES (?, ?)`
	if bt.srv != nil {
		q = bt.srv.rebind(q)
	}
	st, err := bt.db.PrepareContext(ctx, q)
	if err != nil {
		b.Fatal(err)
	}
	return st
}

// BenchmarkVsRoundTrip measures the store's operations each interleaved
// with its baselines on the same database, in one loop (benchpair.Run):
// the means of every call as "<name>-ns", and the operation's ratio to
// SELECT 1 (x-select1) or to the raw INSERT (x-insert) of the same run.
//
//   - replay: Acquire of a completed key, against SELECT 1;
//   - get: Get of that key, against SELECT 1;
//   - acquire-new: Acquire of a new key, against the raw INSERT and
//     SELECT 1;
//   - complete: Complete of a lease acquired beforehand (untimed, in
//     batches as in BenchmarkComplete), against the raw INSERT.
//
// The benchmark's ns/op is the whole iteration, baselines included.
//
//	go test -run '^$' -bench VsRoundTrip -benchtime 2000x -count 3 ./sqlstore/
func BenchmarkVsRoundTrip(b *testing.B) {
	forTargets(b, func(b *testing.B, bt benchTarget) {
		ctx := context.Background()
		completed(b, bt, "k")
		// replay: a replay next to SELECT 1 and to Get, the plain
		// primary-key read of the same row (the floor of any answer that
		// carries the record), in one loop.
		b.Run("replay", func(b *testing.B) {
			m := benchpair.Run(b,
				benchpair.Func{Name: "select1", F: select1(b, bt)},
				benchpair.Func{Name: "get", F: func() {
					rec, err := bt.s.Get(ctx, bt.scope, "k")
					if err != nil || rec.Status != idem.StatusCompleted {
						b.Fatal(rec.Status, err)
					}
				}},
				benchpair.Func{Name: "replay", F: func() {
					res, err := bt.s.Acquire(ctx, bt.req("k"))
					if err != nil || res.Outcome != idem.Completed {
						b.Fatal(res.Outcome, err)
					}
				}},
			)
			benchpair.Ratio(b, "x-select1", m[2], m[0])
			benchpair.Ratio(b, "get-x-select1", m[1], m[0])
			benchpair.Ratio(b, "x-get", m[2], m[1])
		})
		b.Run("acquire-new", func(b *testing.B) {
			var key string
			m := benchpair.Run(b,
				benchpair.Func{Name: "select1", F: select1(b, bt)},
				benchpair.Func{Name: "insert", F: rawInsert(b, bt)},
				benchpair.Func{
					Name:   "acquire",
					Before: func() { key = "new" + strconv.FormatInt(throughput.Next(), 10) },
					F: func() {
						res, err := bt.s.Acquire(ctx, bt.req(key))
						if err != nil || res.Outcome != idem.Acquired {
							b.Fatal(res.Outcome, err)
						}
					},
				},
			)
			benchpair.Ratio(b, "x-insert", m[2], m[1])
			benchpair.Ratio(b, "x-select1", m[2], m[0])
		})
		b.Run("complete", func(b *testing.B) {
			next := leaseBatches(b, bt)
			var l idem.Lease
			m := benchpair.Run(b,
				benchpair.Func{Name: "insert", F: rawInsert(b, bt)},
				benchpair.Func{
					Name:   "complete",
					Before: func() { l = next() },
					F: func() {
						if err := bt.s.Complete(ctx, l, benchResp, long); err != nil {
							b.Fatal(err)
						}
					},
				},
			)
			benchpair.Ratio(b, "x-insert", m[1], m[0])
		})
		// duplicate: Acquire on a key in flight, whose lease (on
		// PostgreSQL, its renewal's) the answer carries, next to Get.
		b.Run("duplicate", func(b *testing.B) {
			l := mustLease(b, bt, "in-flight"+strconv.FormatInt(throughput.Next(), 10))
			if _, err := bt.s.Extend(ctx, l, long); err != nil {
				b.Fatal(err)
			}
			m := benchpair.Run(b,
				benchpair.Func{Name: "select1", F: select1(b, bt)},
				benchpair.Func{Name: "get", F: func() {
					if _, err := bt.s.Get(ctx, bt.scope, l.Key); err != nil {
						b.Fatal(err)
					}
				}},
				benchpair.Func{Name: "duplicate", F: func() {
					res, err := bt.s.Acquire(ctx, bt.req(l.Key))
					if err != nil || res.Outcome != idem.InFlight {
						b.Fatal(res.Outcome, err)
					}
				}},
			)
			benchpair.Ratio(b, "x-select1", m[2], m[0])
			benchpair.Ratio(b, "x-get", m[2], m[1])
		})
		// extend: a renewal (one durable write) next to a raw INSERT.
		b.Run("extend", func(b *testing.B) {
			l := mustLease(b, bt, "extended"+strconv.FormatInt(throughput.Next(), 10))
			m := benchpair.Run(b,
				benchpair.Func{Name: "insert", F: rawInsert(b, bt)},
				benchpair.Func{Name: "extend", F: func() {
					if _, err := bt.s.Extend(ctx, l, long); err != nil {
						b.Fatal(err)
					}
				}},
			)
			benchpair.Ratio(b, "x-insert", m[1], m[0])
		})
	})
}

// mustLease acquires key on bt, which must be new.
func mustLease(b *testing.B, bt benchTarget, key string) idem.Lease {
	b.Helper()
	res, err := bt.s.Acquire(context.Background(), bt.req(key))
	if err != nil || res.Outcome != idem.Acquired {
		b.Fatal(res.Outcome, err)
	}
	return res.Lease
}

// contentionParallelism × GOMAXPROCS goroutines call at once in
// BenchmarkContention.
var contentionParallelism = flag.Int("contention.parallelism", 16, "goroutines per GOMAXPROCS in BenchmarkContention")

// BenchmarkContention compares SQLite connection settings under 32
// concurrent callers (SetParallelism(16) on this package's 2-core
// machines; more on bigger ones). It is how the settings of sqlite.Open
// were chosen; see the package documentation for the numbers. Metrics:
// p50/p99 latency of one operation, and errors per operation (any error,
// "database is locked" included).
//
//	go test -run '^$' -bench Contention -benchtime 3s ./sqlstore/
func BenchmarkContention(b *testing.B) {
	modes := []struct {
		name     string
		sync     string
		maxConns int // 0: unlimited
	}{
		{"wal-full-1conn", "FULL", 1}, // sqlite.Open's settings
		{"wal-full-8conns", "FULL", 8},
		{"wal-full-unlimited", "FULL", 0},
		{"wal-normal-1conn", "NORMAL", 1},
	}
	workloads := []struct {
		name string
		op   func(ctx context.Context, db *sql.DB, s *sqlstore.Store, key string) error
	}{
		{"acquire-complete", func(ctx context.Context, _ *sql.DB, s *sqlstore.Store, key string) error {
			res, err := s.Acquire(ctx, req(key, "fp", long))
			if err != nil {
				return err
			}
			return s.Complete(ctx, res.Lease, benchResp, long)
		}},
		{"business-tx", func(ctx context.Context, db *sql.DB, s *sqlstore.Store, key string) error {
			res, err := s.Acquire(ctx, req(key, "fp", long))
			if err != nil {
				return err
			}
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, amount) VALUES (?, 4200)`, key); err != nil {
				return err
			}
			if err := s.CompleteTx(ctx, tx, res.Lease, benchResp, long); err != nil {
				return err
			}
			return tx.Commit()
		}},
		{"replay", func(ctx context.Context, _ *sql.DB, s *sqlstore.Store, _ string) error {
			res, err := s.Acquire(ctx, req("hot", "fp", long))
			if err == nil && res.Outcome != idem.Completed {
				err = fmt.Errorf("outcome %v", res.Outcome)
			}
			return err
		}},
	}
	for _, m := range modes {
		for _, w := range workloads {
			b.Run(m.name+"/"+w.name, func(b *testing.B) {
				ctx := context.Background()
				path := filepath.Join(b.TempDir(), "c.db")
				dsn := strings.Replace(sqlite.DSN(path), "_synchronous=FULL", "_synchronous="+m.sync, 1)
				db, err := sql.Open("sqlite", dsn)
				if err != nil {
					b.Fatal(err)
				}
				defer db.Close()
				db.SetMaxOpenConns(m.maxConns)
				db.SetMaxIdleConns(max(m.maxConns, 64))
				s := newStore(b, db)
				if err := s.Migrate(ctx); err != nil {
					b.Fatal(err)
				}
				if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, amount INTEGER NOT NULL)`); err != nil {
					b.Fatal(err)
				}
				hot, err := s.Acquire(ctx, req("hot", "fp", long))
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Complete(ctx, hot.Lease, benchResp, long); err != nil {
					b.Fatal(err)
				}
				var (
					seq    atomic.Int64
					errs   atomic.Int64
					locked atomic.Int64
					mu     sync.Mutex
					lat    []time.Duration
				)
				b.SetParallelism(*contentionParallelism)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					var mine []time.Duration
					for pb.Next() {
						key := fmt.Sprint("k", seq.Add(1))
						t0 := time.Now()
						err := w.op(ctx, db, s, key)
						mine = append(mine, time.Since(t0))
						if err != nil {
							errs.Add(1)
							if isLocked(err) {
								locked.Add(1)
							}
						}
					}
					mu.Lock()
					lat = append(lat, mine...)
					mu.Unlock()
				})
				b.StopTimer()
				slices.Sort(lat)
				if len(lat) > 0 {
					b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
					b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
					b.ReportMetric(float64(lat[len(lat)-1].Milliseconds()), "max-ms")
				}
				b.ReportMetric(float64(errs.Load())/float64(b.N), "errors/op")
				b.ReportMetric(float64(locked.Load())/float64(b.N), "locked/op")
			})
		}
	}
}

// BenchmarkGet reads one completed record by its key: the floor of what
// a replay costs on each database.
func BenchmarkGet(b *testing.B) {
	forTargets(b, func(b *testing.B, bt benchTarget) {
		ctx := context.Background()
		completed(b, bt, "k")
		for b.Loop() {
			if _, err := bt.s.Get(ctx, bt.scope, "k"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
