package tieredtest_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
	"github.com/idemkit/idem/tieredstore"
)

// redisClient returns a client of the Redis server at IDEM_REDIS_ADDR,
// or skips t (fails it under IDEM_REQUIRE_SERVICES=1).
func redisClient(t testing.TB) *redis.Client {
	t.Helper()
	addr := testenv.Redis.Need(t)
	c := newClient(addr)
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		testenv.Unavailable(t, testenv.Redis.Name, testenv.Redis.Var, err)
	}
	return c
}

func newClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64, ContextTimeoutEnabled: true})
}

// newTruth opens a fresh, migrated SQLite store in t's temporary
// directory, closed when t ends, with a business table "effects" next to
// the records.
func newTruth(t testing.TB) (*sql.DB, *sqlstore.Store) {
	t.Helper()
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	s, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
	if err != nil {
		t.Fatalf("sqlstore.New: %v", err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE effects (id INTEGER PRIMARY KEY, key TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return db, s
}

// randomPrefix returns a key prefix no other test or run uses.
func randomPrefix() string {
	return "tieredtest-" + strings.ToLower(rand.Text()[:12])
}

// newTiered returns a tiered store over front and truth with a random
// prefix (unless cfg sets one) and a 1 s Timeout (unless cfg sets one:
// the outage tests do); keys of the prefix are deleted from the server
// behind cleanup when t ends. The long timeout keeps a slow Redis call on
// a loaded machine (a 1 MB SET under -race) from opening the circuit in
// the tests that are not about outages: a cache write skipped then is a
// documented non-guarantee (a stale in-flight entry answers 409 until its
// TTL), which the conformance suite would report as a failure.
func newTiered(t testing.TB, front tieredstore.Client, cleanup *redis.Client, truth idem.Store, cfg *tieredstore.Config) tieredstore.Store {
	t.Helper()
	var c tieredstore.Config
	if cfg != nil {
		c = *cfg
	}
	if c.Prefix == "" {
		c.Prefix = randomPrefix()
	}
	if c.Timeout == 0 {
		// 1 s was not enough with other test processes on the machine:
		// 200 racing replays on a pool of 64 waited longer for a
		// connection, and the circuit sent the rest to the truth.
		c.Timeout = 5 * time.Second
	}
	s, err := tieredstore.New(front, truth, &c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { deletePrefix(t, cleanup, c.Prefix) })
	return s
}

// deletePrefix deletes every key of prefix (never anything else).
func deletePrefix(t testing.TB, c *redis.Client, prefix string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
		if len(keys) == 500 {
			if err := c.Del(ctx, keys...).Err(); err != nil {
				t.Errorf("cleanup: DEL: %v", err)
			}
			keys = keys[:0]
		}
	}
	if err := iter.Err(); err != nil {
		t.Errorf("cleanup: SCAN %s:*: %v", prefix, err)
	}
	if len(keys) > 0 {
		if err := c.Del(ctx, keys...).Err(); err != nil {
			t.Errorf("cleanup: DEL: %v", err)
		}
	}
}

// countedTiered returns a tiered store on the shared Redis over a fresh
// SQLite truth, the counting wrapper the tiered store calls, and the
// truth itself (to act behind the cache's back).
func countedTiered(t *testing.T) (tieredstore.Store, *countingStore, *sqlstore.Store) {
	t.Helper()
	c := redisClient(t)
	_, sql := newTruth(t)
	truth := &countingStore{Store: sql}
	return newTiered(t, c, c, truth, nil), truth, sql
}

// countingStore counts the calls that reach the store it wraps.
type countingStore struct {
	idem.Store
	acquire, complete, get, other atomic.Int64
}

func (c *countingStore) Acquire(ctx context.Context, req idem.AcquireRequest) (idem.AcquireResult, error) {
	c.acquire.Add(1)
	return c.Store.Acquire(ctx, req)
}

func (c *countingStore) Complete(ctx context.Context, l idem.Lease, resp idem.Response, retention time.Duration) error {
	c.complete.Add(1)
	return c.Store.Complete(ctx, l, resp, retention)
}

// CompleteRecord counts as a completion; the wrapped store must be a
// tieredstore.RecordCompleter (sqlstore is).
func (c *countingStore) CompleteRecord(ctx context.Context, l idem.Lease, resp idem.Response, retention time.Duration) (idem.Record, error) {
	c.complete.Add(1)
	return c.Store.(tieredstore.RecordCompleter).CompleteRecord(ctx, l, resp, retention)
}

func (c *countingStore) Get(ctx context.Context, scope, key string) (idem.Record, error) {
	c.get.Add(1)
	return c.Store.Get(ctx, scope, key)
}

func (c *countingStore) Release(ctx context.Context, l idem.Lease) error {
	c.other.Add(1)
	return c.Store.Release(ctx, l)
}

func (c *countingStore) Extend(ctx context.Context, l idem.Lease, ttl time.Duration) (idem.Lease, error) {
	c.other.Add(1)
	return c.Store.Extend(ctx, l, ttl)
}

func (c *countingStore) Delete(ctx context.Context, scope, key string) error {
	c.other.Add(1)
	return c.Store.Delete(ctx, scope, key)
}

// calls is the number of calls that reached the wrapped store.
func (c *countingStore) calls() int64 {
	return c.acquire.Load() + c.complete.Load() + c.get.Load() + c.other.Load()
}
