package lincheck_test

import (
	"context"
	"database/sql"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // registers the "mysql" driver
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/lincheck"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/redisstore"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
	"github.com/idemkit/idem/tieredstore"
)

// newSQLStore migrates a store of dialect on db, a database of the test's
// own (so that its Sweep meets only this test's records).
func newSQLStore(t *testing.T, db *sql.DB, dialect sqlstore.Dialect) *sqlstore.Store {
	t.Helper()
	s, err := sqlstore.New(db, &sqlstore.Config{Dialect: dialect})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func sqliteDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func redisClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 32, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		testenv.Unavailable(t, testenv.Redis.Name, testenv.Redis.Var, err)
	}
	return c
}

func newRedisStore(t *testing.T, c redis.UniversalClient) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(c, &redisstore.Config{Prefix: testdb.RandomName("lin")})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// mysqlWithMode is a pool on the test's own MySQL/MariaDB database whose
// sessions run under sql_mode (empty: the server's default).
func mysqlWithMode(t *testing.T, mode string) *sql.DB {
	t.Helper()
	_, dsn := testdb.MySQL(t)
	if mode != "" {
		dsn += "&sql_mode=" + url.QueryEscape("'"+mode+"'")
	}
	return testdb.Open(t, "mysql", dsn, testenv.MySQL)
}

// stores are the stores of the contract, each on its server directly.
var stores = []struct {
	name string
	new  func(t *testing.T) (idem.Store, lincheck.StoreModelConfig)
}{
	{"sqlite", func(t *testing.T) (idem.Store, lincheck.StoreModelConfig) {
		return newSQLStore(t, sqliteDB(t), sqlstore.SQLite), lincheck.StoreModelConfig{}
	}},
	{"postgres", func(t *testing.T) (idem.Store, lincheck.StoreModelConfig) {
		db, _ := testdb.Postgres(t)
		return newSQLStore(t, db, sqlstore.PostgreSQL), lincheck.StoreModelConfig{}
	}},
	{"postgres-serializable", func(t *testing.T) (idem.Store, lincheck.StoreModelConfig) {
		db, _ := testdb.PostgresAt(t, "serializable")
		return newSQLStore(t, db, sqlstore.PostgreSQL), lincheck.StoreModelConfig{}
	}},
	{"mariadb", func(t *testing.T) (idem.Store, lincheck.StoreModelConfig) {
		return newSQLStore(t, mysqlWithMode(t, ""), sqlstore.MySQL), lincheck.StoreModelConfig{}
	}},
	{"mariadb-oracle-mode", func(t *testing.T) (idem.Store, lincheck.StoreModelConfig) {
		return newSQLStore(t, mysqlWithMode(t, "ORACLE,EMPTY_STRING_IS_NULL"), sqlstore.MySQL), lincheck.StoreModelConfig{}
	}},
	{"mariadb-serializable", func(t *testing.T) (idem.Store, lincheck.StoreModelConfig) {
		db, _ := testdb.MySQLAt(t, "SERIALIZABLE")
		return newSQLStore(t, db, sqlstore.MySQL), lincheck.StoreModelConfig{}
	}},
	{"redis", func(t *testing.T) (idem.Store, lincheck.StoreModelConfig) {
		c := redisClient(t, testenv.Redis.Need(t))
		return newRedisStore(t, c), lincheck.StoreModelConfig{DropsExpired: true}
	}},
	{"tiered", func(t *testing.T) (idem.Store, lincheck.StoreModelConfig) {
		c := redisClient(t, testenv.Redis.Need(t))
		s, err := tieredstore.New(c, newSQLStore(t, sqliteDB(t), sqlstore.SQLite), &tieredstore.Config{Prefix: testdb.RandomName("lin")})
		if err != nil {
			t.Fatal(err)
		}
		return s, lincheck.StoreModelConfig{}
	}},
}

// TestStores: every store's history under a concurrent workload is
// linearizable.
func TestStores(t *testing.T) {
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			store, cfg := st.new(t)
			stats := checkStore(t, store, cfg, lincheck.StoreWorkload{Sweep: true, SplitReadBack: strings.HasPrefix(st.name, "mariadb")})
			if stats.Acquired == 0 || stats.Replayed == 0 {
				t.Errorf("the workload did little: %v", stats)
			}
		})
	}
}
