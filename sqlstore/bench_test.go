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
	"github.com/idemkit/idem/sqlstore"
)

// The single-goroutine benchmarks measure one call, on SQLite (a file
// database opened by OpenSQLite: WAL, synchronous=FULL, every commit
// fsynced) and on each server (skipped when it is unreachable).
// BaselineSelect1 and BaselineInsert put them in proportion: a prepared
// SELECT 1 (one round trip), and a raw one-row INSERT in its own
// transaction (one round trip and one durable commit) on the same
// database.
//
//	go test -run '^$' -bench 'AcquireNew|Complete$|Replay|Baseline' -benchmem -count 3 ./sqlstore/

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
		leases := make([]idem.Lease, 0, 1024)
		for i := 0; b.Loop(); i++ {
			if len(leases) == 0 {
				b.StopTimer()
				for j := range cap(leases) {
					res, err := bt.s.Acquire(ctx, bt.req(fmt.Sprint("k", i, "-", j)))
					if err != nil {
						b.Fatal(err)
					}
					leases = append(leases, res.Lease)
				}
				b.StartTimer()
			}
			l := leases[len(leases)-1]
			leases = leases[:len(leases)-1]
			if err := bt.s.Complete(ctx, l, benchResp, long); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkReplay(b *testing.B) {
	forTargets(b, func(b *testing.B, bt benchTarget) {
		ctx := context.Background()
		res, err := bt.s.Acquire(ctx, bt.req("k"))
		if err != nil {
			b.Fatal(err)
		}
		if err := bt.s.Complete(ctx, res.Lease, benchResp, long); err != nil {
			b.Fatal(err)
		}
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
		ctx := context.Background()
		stmt, err := bt.db.PrepareContext(ctx, "SELECT 1")
		if err != nil {
			b.Fatal(err)
		}
		defer stmt.Close()
		var one int
		for b.Loop() {
			if err := stmt.QueryRowContext(ctx).Scan(&one); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkBaselineInsert(b *testing.B) {
	forTargets(b, func(b *testing.B, bt benchTarget) {
		ctx := context.Background()
		ddl, table := `CREATE TABLE t (k TEXT PRIMARY KEY, v BLOB)`, "t"
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
		insert, prefix := `INSERT INTO `+table+` (k, v) VALUES (?, ?)`, randomName("")
		if bt.srv != nil {
			insert = bt.srv.rebind(insert)
			b.Cleanup(func() {
				_, _ = bt.db.ExecContext(context.Background(), bt.srv.rebind(`DELETE FROM idem_bench_insert WHERE k LIKE ?`), prefix+"%")
			})
		}
		stmt, err := bt.db.PrepareContext(ctx, insert)
		if err != nil {
			b.Fatal(err)
		}
		defer stmt.Close()
		for i := 0; b.Loop(); i++ {
			if _, err := stmt.ExecContext(ctx, prefix+strconv.Itoa(i), benchResp.Body); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// contentionParallelism × GOMAXPROCS goroutines call at once in
// BenchmarkContention.
var contentionParallelism = flag.Int("contention.parallelism", 16, "goroutines per GOMAXPROCS in BenchmarkContention")

// BenchmarkContention compares SQLite connection settings under 32
// concurrent callers (SetParallelism(16) on this package's 2-core
// machines; more on bigger ones). It is how the settings of OpenSQLite
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
		{"wal-full-1conn", "FULL", 1}, // OpenSQLite's settings
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
				dsn := strings.Replace(sqlstore.SQLiteDSN(path), "_synchronous=FULL", "_synchronous="+m.sync, 1)
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
		res, err := bt.s.Acquire(ctx, bt.req("k"))
		if err != nil {
			b.Fatal(err)
		}
		if err := bt.s.Complete(ctx, res.Lease, benchResp, long); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := bt.s.Get(ctx, bt.scope, "k"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
