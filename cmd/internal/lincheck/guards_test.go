package lincheck_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/lincheck"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/lock"
	"github.com/idemkit/idem/redisstore"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/token"
)

const margin = 5 * time.Millisecond

type (
	sqlDB         = sql.DB
	netfaultProxy = netfault.Proxy
)

func sqlLocks(t *testing.T, d sqlstore.Dialect, db func(t *testing.T) *sqlDB) lock.Backend {
	t.Helper()
	b, err := sqlstore.NewLockBackend(db(t), &sqlstore.Config{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return b
}

func sqlTokens(t *testing.T, d sqlstore.Dialect, db func(t *testing.T) *sqlDB) token.Store {
	t.Helper()
	s, err := sqlstore.NewTokenStore(db(t), &sqlstore.Config{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

func pgDB(t *testing.T) *sqlDB    { db, _ := testdb.Postgres(t); return db }
func mysqlDB(t *testing.T) *sqlDB { db, _ := testdb.MySQL(t); return db }

// TestLocks: every lock backend's history is linearizable: one holder at
// a time, fences that only grow, leases of at least their TTL.
func TestLocks(t *testing.T) {
	for _, c := range []struct {
		name string
		new  func(t *testing.T) lock.Backend
	}{
		{"memory", func(*testing.T) lock.Backend { return lock.NewMemoryBackend() }},
		{"sqlite", func(t *testing.T) lock.Backend { return sqlLocks(t, sqlstore.SQLite, sqliteDB) }},
		{"postgres", func(t *testing.T) lock.Backend { return sqlLocks(t, sqlstore.PostgreSQL, pgDB) }},
		{"mariadb", func(t *testing.T) lock.Backend { return sqlLocks(t, sqlstore.MySQL, mysqlDB) }},
		{"redis", func(t *testing.T) lock.Backend {
			b, err := redisstore.NewLockBackend(redisClient(t, testenv.Redis.Need(t)), &redisstore.LockConfig{Prefix: testdb.RandomName("lin")})
			if err != nil {
				t.Fatal(err)
			}
			return b
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h, counts := lincheck.RunLocks(context.Background(), c.new(t), lincheck.LockWorkload{})
			t.Logf("%v", counts)
			h.Check(t, lincheck.LockModel(margin))
			if counts["Acquire <nil>"] == 0 || counts["Acquire lock: held by another owner"] == 0 {
				t.Errorf("the workload did little: %v", counts)
			}
		})
	}
}

// TestTokenStores: every token store's history is linearizable: a token
// is spent once, a second use gets the first use's result, an expired
// token is invalid.
func TestTokenStores(t *testing.T) {
	for _, c := range []struct {
		name  string
		new   func(t *testing.T) token.Store
		drops bool
	}{
		{"memory", func(*testing.T) token.Store { return token.NewMemoryStore() }, false},
		{"sqlite", func(t *testing.T) token.Store { return sqlTokens(t, sqlstore.SQLite, sqliteDB) }, false},
		{"postgres", func(t *testing.T) token.Store { return sqlTokens(t, sqlstore.PostgreSQL, pgDB) }, false},
		{"mariadb", func(t *testing.T) token.Store { return sqlTokens(t, sqlstore.MySQL, mysqlDB) }, false},
		{"redis", func(t *testing.T) token.Store {
			s, err := redisstore.NewTokenStore(redisClient(t, testenv.Redis.Need(t)), &redisstore.TokenConfig{Prefix: testdb.RandomName("lin")})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h, counts := lincheck.RunTokens(context.Background(), c.new(t), lincheck.TokenWorkload{Sweep: true})
			t.Logf("%v", counts)
			h.Check(t, lincheck.TokenModel(margin, c.drops))
			// Invalid answers (a token expired, or swept) depend on timing
			// and may not come in a run on a fast store: not required.
			if counts["Consume ok"] == 0 || counts["Consume used"] == 0 || counts["Insert duplicate"] == 0 {
				t.Errorf("the workload did little: %v", counts)
			}
		})
	}
}

// TestLocksAndTokensUnderFaults: the lock backends and token stores on a
// server stay linearizable while the connections to it fail.
func TestLocksAndTokensUnderFaults(t *testing.T) {
	dbVia := func(driver string, svc testenv.Service, dsn string) func(t *testing.T) (*sqlDB, *netfaultProxy) {
		return func(t *testing.T) (*sqlDB, *netfaultProxy) {
			dsn, p := viaProxy(t, dsn)
			return testdb.Open(t, driver, dsn, svc), p
		}
	}
	servers := []struct {
		name  string
		open  func(t *testing.T) (*sqlDB, *netfaultProxy)
		d     sqlstore.Dialect
		redis bool
	}{
		{"postgres", func(t *testing.T) (*sqlDB, *netfaultProxy) {
			_, dsn := testdb.Postgres(t)
			return dbVia("pgx", testenv.Postgres, dsn)(t)
		}, sqlstore.PostgreSQL, false},
		{"mariadb", func(t *testing.T) (*sqlDB, *netfaultProxy) {
			_, dsn := testdb.MySQL(t)
			return dbVia("mysql", testenv.MySQL, dsn)(t)
		}, sqlstore.MySQL, false},
		{"redis", nil, nil, true},
	}
	for _, srv := range servers {
		t.Run("lock/"+srv.name, func(t *testing.T) {
			t.Parallel()

			var b lock.Backend
			var p *netfaultProxy
			if srv.redis {
				var addr string
				addr, p = viaProxy(t, testenv.Redis.Need(t))
				rb, err := redisstore.NewLockBackend(redisClient(t, addr), &redisstore.LockConfig{Prefix: testdb.RandomName("lin")})
				if err != nil {
					t.Fatal(err)
				}
				b = rb
			} else {
				var db *sqlDB
				db, p = srv.open(t)
				b = sqlLocks(t, srv.d, func(*testing.T) *sqlDB { return db })
			}
			faults := inject(p, 700*time.Millisecond)
			h, counts := lincheck.RunLocks(context.Background(), b, lincheck.LockWorkload{Timeout: 500 * time.Millisecond, SplitResend: srv.redis, MaxUnknown: maxUnknown})
			t.Logf("%v; faults: %v", counts, faults.Stop())
			h.Check(t, lincheck.LockModel(margin))
		})
		t.Run("token/"+srv.name, func(t *testing.T) {
			t.Parallel()
			var s token.Store
			var p *netfaultProxy
			if srv.redis {
				var addr string
				addr, p = viaProxy(t, testenv.Redis.Need(t))
				rs, err := redisstore.NewTokenStore(redisClient(t, addr), &redisstore.TokenConfig{Prefix: testdb.RandomName("lin")})
				if err != nil {
					t.Fatal(err)
				}
				s = rs
			} else {
				var db *sqlDB
				db, p = srv.open(t)
				s = sqlTokens(t, srv.d, func(*testing.T) *sqlDB { return db })
			}
			faults := inject(p, 700*time.Millisecond)
			// Keeps longer than a call's retries take: a Consume that
			// go-redis sends again after a lost reply, past the token's
			// expiry, finds it gone (token.Spend.Keep, 24 h by default).
			h, counts := lincheck.RunTokens(context.Background(), s, lincheck.TokenWorkload{Timeout: 500 * time.Millisecond, Sweep: true, SplitResend: srv.redis, MaxUnknown: maxUnknown,
				TTLs: []time.Duration{100 * time.Millisecond, 250 * time.Millisecond, time.Second}})
			t.Logf("%v; faults: %v", counts, faults.Stop())
			h.Check(t, lincheck.TokenModel(margin, srv.redis))
		})
	}
}
