package tieredtest_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/throughput"
	"github.com/idemkit/idem/sqlstore"
)

// BenchmarkThroughput measures 64 goroutines at once (SetParallelism(64 /
// GOMAXPROCS)), each operation Acquire on a new key then Complete, on the
// tiered store over a PostgreSQL truth and on that truth alone, against
// 64 goroutines running SELECT 1 on PostgreSQL and PING on Redis, in the
// same run. The PostgreSQL pool holds 32 connections, Redis' 64.
//
//	go test -run '^$' -bench Throughput -benchmem -benchtime 1s -count 3 ./cmd/internal/tieredtest/
func BenchmarkThroughput(b *testing.B) {
	c := redisClient(b)
	db, truth := postgresTruth(b)
	s := newTiered(b, c, c, truth, nil)
	scope := "bench-" + strings.ToLower(rand.Text()[:12])
	b.Cleanup(func() {
		_, _ = db.ExecContext(context.Background(), `DELETE FROM idem_records WHERE scope = $1`, scope)
	})
	acquireComplete := func(store idem.Store) func(ctx context.Context, n int64) error {
		return func(ctx context.Context, n int64) error {
			res, err := store.Acquire(ctx, idem.AcquireRequest{Scope: scope, Key: "t" + strconv.FormatInt(n, 10), Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
			if err != nil {
				return err
			}
			if res.Outcome != idem.Acquired {
				return fmt.Errorf("outcome %v", res.Outcome)
			}
			return store.Complete(ctx, res.Lease, idem.Response{StatusCode: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: make([]byte, 256)}, time.Hour)
		}
	}
	stmt, err := db.PrepareContext(b.Context(), "SELECT 1")
	if err != nil {
		b.Fatal(err)
	}
	defer stmt.Close()
	b.Run("postgres-select1", func(b *testing.B) {
		throughput.Run(b, func(ctx context.Context, _ int64) error {
			var one int
			return stmt.QueryRowContext(ctx).Scan(&one)
		})
	})
	b.Run("redis-ping", func(b *testing.B) {
		throughput.Run(b, func(ctx context.Context, _ int64) error { return c.Ping(ctx).Err() })
	})
	b.Run("truth-acquire-complete", func(b *testing.B) { throughput.Run(b, acquireComplete(truth)) })
	b.Run("tiered-acquire-complete", func(b *testing.B) { throughput.Run(b, acquireComplete(s)) })
	if st := s.Stats(); st.Errors != 0 {
		b.Fatalf("stats %+v", st)
	}
}

// postgresTruth opens the PostgreSQL test database with a pool of 32
// connections and returns it with a migrated store, or skips b.
func postgresTruth(b *testing.B) (*sql.DB, *sqlstore.Store) {
	b.Helper()
	addr := testenv.Postgres.Need(b)
	db, err := sql.Open("pgx", addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	if err := db.PingContext(b.Context()); err != nil {
		testenv.Unavailable(b, testenv.Postgres.Name, testenv.Postgres.Var, err)
	}
	s, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.PostgreSQL})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Migrate(b.Context()); err != nil {
		b.Fatal(err)
	}
	return db, s
}
