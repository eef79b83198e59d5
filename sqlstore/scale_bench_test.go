package sqlstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/benchpair"
	"github.com/idemkit/idem/internal/throughput"
)

// The scale benchmarks measure the store under load and with many
// records, each against a baseline of the same database in the same run:
//
//	go test -run '^$' -bench 'Throughput|Scale' -benchmem -benchtime 0.5s -count 3 ./sqlstore/
//
// BenchmarkThroughput: 64 goroutines at once (SetParallelism(64 /
// GOMAXPROCS)), each operation Acquire on a new key then Complete, against
// 64 goroutines running a prepared SELECT 1. The servers' pools hold
// scalePool connections; SQLite keeps sqlite.Open's single connection.
//
// BenchmarkScale: Acquire on a new key, a replay of a random completed
// key, and a replay of a recent one (among the last recentKeys written:
// retries come seconds after the first request), with 10 thousand and 1
// million completed records in the scope, against SELECT 1 and a raw
// one-row INSERT, all five interleaved in one loop (benchpair) so that
// the ratios of the two sizes compare:
//
//	go test -run '^$' -bench Scale -benchmem -benchtime 3000x ./sqlstore/
//
// The records are written by one INSERT … SELECT per
// batch (generate_series on PostgreSQL, a recursive CTE elsewhere), and
// deleted when the benchmark ends. -short skips the million.

// scalePool is the connection pool of the servers in the scale
// benchmarks: enough for 64 callers to queue on without exhausting
// PostgreSQL's default 100 connections next to other test processes.
const scalePool = 32

// recentKeys is how many of the last completed records BenchmarkScale's
// replay-recent picks from.
const recentKeys = 1000

func BenchmarkThroughput(b *testing.B) {
	forTargets(b, func(b *testing.B, bt benchTarget) {
		if bt.srv != nil {
			bt.db.SetMaxOpenConns(scalePool)
			bt.db.SetMaxIdleConns(scalePool)
		}
		ctx := context.Background()
		stmt, err := bt.db.PrepareContext(ctx, "SELECT 1")
		if err != nil {
			b.Fatal(err)
		}
		defer stmt.Close()
		b.Run("select1", func(b *testing.B) {
			throughput.Run(b, func(ctx context.Context, _ int64) error {
				var one int
				return stmt.QueryRowContext(ctx).Scan(&one)
			})
		})
		b.Run("acquire-complete", func(b *testing.B) {
			throughput.Run(b, func(ctx context.Context, n int64) error {
				res, err := bt.s.Acquire(ctx, bt.req("t"+strconv.FormatInt(n, 10)))
				if err != nil {
					return err
				}
				if res.Outcome != idem.Acquired {
					return fmt.Errorf("outcome %v", res.Outcome)
				}
				return bt.s.Complete(ctx, res.Lease, benchResp, long)
			})
		})
	})
}

func BenchmarkScale(b *testing.B) {
	forTargets(b, func(b *testing.B, bt benchTarget) {
		ctx := context.Background()
		sel, err := bt.db.PrepareContext(ctx, "SELECT 1")
		if err != nil {
			b.Fatal(err)
		}
		defer sel.Close()
		ins := prepareRawInsert(b, bt)
		defer ins.Close()
		insPrefix := randomName("scale-")
		filled := 0
		for _, size := range []struct {
			name string
			n    int
		}{{"records=10k", 10_000}, {"records=1M", 1_000_000}} {
			b.Run(size.name, func(b *testing.B) {
				if testing.Short() && size.n > 10_000 {
					b.Skip("-short: no million records")
				}
				t0 := time.Now()
				fillCompleted(b, bt, filled, size.n)
				b.Logf("filled %d records in %v", size.n-filled, time.Since(t0).Round(time.Millisecond))
				filled = size.n
				// One loop (benchpair), so that the ratios of one size
				// compare with those of the other whatever the machine
				// did in between.
				replay := func(key func() string) func() {
					return func() {
						res, err := bt.s.Acquire(ctx, bt.req(key()))
						if err != nil || res.Outcome != idem.Completed {
							b.Fatal(res.Outcome, err)
						}
					}
				}
				m := benchpair.Run(b,
					benchpair.Func{Name: "select1", F: func() {
						var one int
						if err := sel.QueryRowContext(ctx).Scan(&one); err != nil {
							b.Fatal(err)
						}
					}},
					benchpair.Func{Name: "insert", F: func() {
						if _, err := ins.ExecContext(ctx, insPrefix+strconv.FormatInt(throughput.Next(), 10), benchResp.Body); err != nil {
							b.Fatal(err)
						}
					}},
					benchpair.Func{Name: "acquire-new", F: func() {
						res, err := bt.s.Acquire(ctx, bt.req("new"+strconv.FormatInt(throughput.Next(), 10)))
						if err != nil || res.Outcome != idem.Acquired {
							b.Fatal(res.Outcome, err)
						}
					}},
					// A key drawn uniformly from all the records.
					benchpair.Func{Name: "replay", F: replay(func() string { return "k" + strconv.Itoa(rand.IntN(size.n)) })},
					// One of the last recentKeys records written
					// (fillCompleted wrote "k<n-1>" last).
					benchpair.Func{Name: "replay-recent", F: replay(func() string {
						return "k" + strconv.Itoa(size.n-1-rand.IntN(min(recentKeys, size.n)))
					})},
				)
				benchpair.Ratio(b, "acquire-x-insert", m[2], m[1])
				benchpair.Ratio(b, "replay-x-select1", m[3], m[0])
				benchpair.Ratio(b, "recent-x-select1", m[4], m[0])
			})
		}
		if bt.srv != nil {
			b.Cleanup(func() {
				_, _ = bt.db.ExecContext(context.Background(), bt.srv.rebind(`DELETE FROM idem_bench_insert WHERE k LIKE ?`), insPrefix+"%")
			})
		}
	})
}

// fillCompleted inserts the completed records "k<from>" … "k<to-1>" of
// bt.scope, as Complete would leave them with benchResp, in batches of
// 100,000 rows: one INSERT … SELECT each.
func fillCompleted(b *testing.B, bt benchTarget, from, to int) {
	b.Helper()
	const cols = `scope, idempotency_key, fingerprint, status, owner, fence,
		lease_until, retention_ms, response_status, response_header,
		response_body, body_omitted, created_at, completed_at, expires_at`
	var q string
	switch {
	case bt.srv == nil: // SQLite
		q = `WITH RECURSIVE g(n) AS (SELECT ? UNION ALL SELECT n + 1 FROM g WHERE n + 1 < ?)
			INSERT INTO idem_records (` + cols + `)
			SELECT ?, 'k' || n, 'fp', 'completed', 'bench-owner', 1,
			       ?, ?, 201, ?, ?, 0, ?, ?, ?
			FROM g`
	case bt.srv.dialect.String() == "postgres":
		q = `INSERT INTO idem_records (` + cols + `)
			SELECT $3::text, 'k' || n, 'fp', 'completed', 'bench-owner', 1,
			       $4::bigint, $5::bigint, 201, $6::text, $7::bytea, false, $8::bigint, $9::bigint, $10::bigint
			FROM generate_series($1::bigint, $2::bigint - 1) n`
	default: // MySQL: a recursive CTE of 1000 rows (MySQL's default depth), squared
		q = `INSERT INTO idem_records (` + cols + `)
			WITH RECURSIVE d(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM d WHERE n < 999)
			SELECT ?, CONCAT('k', ? + a.n * 1000 + b.n), 'fp', 'completed', 'bench-owner', 1,
			       ?, ?, 201, ?, ?, FALSE, ?, ?, ?
			FROM d a CROSS JOIN d b WHERE a.n * 1000 + b.n < ? - ?`
	}
	header, err := json.Marshal(benchResp.Header)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now().UnixMilli()
	retention := long.Milliseconds()
	const batch = 100_000
	for lo := from; lo < to; lo += batch {
		hi := min(lo+batch, to)
		var args []any
		rest := []any{now, retention, string(header), benchResp.Body, now, now, now + retention}
		switch {
		case bt.srv == nil:
			args = append([]any{lo, hi, bt.scope}, rest...)
		case bt.srv.dialect.String() == "postgres":
			args = append([]any{lo, hi, bt.scope}, rest...)
		default:
			args = append(append([]any{bt.scope, lo}, rest...), hi, lo)
		}
		res, err := bt.db.ExecContext(context.Background(), q, args...)
		if err != nil {
			b.Fatalf("fill %d…%d: %v", lo, hi, err)
		}
		if n, err := res.RowsAffected(); err != nil || n != int64(hi-lo) {
			b.Fatalf("fill %d…%d: %d rows, %v", lo, hi, n, err)
		}
	}
}
