package idemcli

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/dsn"
	"github.com/idemkit/idem/redisstore"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/tieredstore"
)

// storeHelp describes the values of a store flag, for the commands' help.
const storeHelp = `A store is one of
  sqlite:PATH                         a SQLite file (its directory is created)
  postgres://user:pass@host:port/db   PostgreSQL (postgresql:// too)
  mysql://user:pass@host:port/db      MySQL/MariaDB (or mysql:GO-SQL-DRIVER-DSN)
  redis://[user:pass@]host:port/db    Redis (rediss:// for TLS)
and -cache redis://… puts Redis in front of a SQL store (package
tieredstore): Redis answers replays and in-flight duplicates, the
database decides.`

// storeFlags are the flags that name a store.
type storeFlags struct {
	name  string // the flag's name: "store" or "db"
	raw   string
	cache string
}

// openedStore is a store a command opened, and what it needs to close.
type openedStore struct {
	store   idem.Store
	sql     *sqlstore.Store   // the SQL store, if any (the truth under a cache)
	redis   *redisstore.Store // the Redis store, if the store is Redis alone
	db      *sql.DB           // sql's database
	dialect sqlstore.Dialect  // sql's dialect
	display string            // the store, without passwords
	kind    string            // its kind, as metrics name it: "sqlite", "postgres", "mysql", "redis", "tiered"
	closers []func() error
}

func (o *openedStore) Close() {
	for i := len(o.closers) - 1; i >= 0; i-- {
		_ = o.closers[i]()
	}
}

// openOptions say how a command opens its store.
type openOptions struct {
	// migrate creates or updates the SQL tables (the proxy does on start).
	migrate bool
	log     *slog.Logger
}

// parseStore checks a store flag's values without connecting; its errors
// name the flag and the fix.
func (f storeFlags) parse() (sqlTarget *dsn.DB, redisOpts *redis.Options, cacheOpts *redis.Options, err error) {
	if f.raw == "" {
		return nil, nil, nil, usagef("-%s is empty: give a store, e.g. -%s sqlite:./idem.db (run 'idem help' for the forms)", f.name, f.name)
	}
	if dsn.IsRedis(f.raw) {
		if f.cache != "" {
			return nil, nil, nil, usagef("-cache puts Redis in front of a SQL store, and -%s is Redis: give -%s a SQL database, or leave -cache out", f.name, f.name)
		}
		opts, _, err := dsn.ParseRedis(f.raw)
		if err != nil {
			return nil, nil, nil, usagef("-%s %v", f.name, err)
		}
		return nil, opts, nil, nil
	}
	t, err := dsn.ParseDB(f.raw)
	if err != nil {
		return nil, nil, nil, usagef("-%s: %v", f.name, err)
	}
	if f.cache != "" {
		if cacheOpts, _, err = dsn.ParseRedis(f.cache); err != nil {
			return nil, nil, nil, usagef("-cache %v", err)
		}
	}
	return &t, nil, cacheOpts, nil
}

// open opens the store f names.
func (f storeFlags) open(ctx context.Context, o openOptions) (*openedStore, error) {
	target, redisOpts, cacheOpts, err := f.parse()
	if err != nil {
		return nil, err
	}
	log := o.log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	out := &openedStore{}
	if redisOpts != nil {
		rdb := redis.NewClient(redisOpts)
		out.closers = append(out.closers, rdb.Close)
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := rdb.Ping(pctx).Err(); err != nil {
			out.Close()
			return nil, fmt.Errorf("-%s %s: %w (is Redis running there?)", f.name, dsn.Redact(f.raw), err)
		}
		rs, err := redisstore.New(rdb, &redisstore.Config{Logger: log})
		if err != nil {
			out.Close()
			return nil, fmt.Errorf("-%s: %w", f.name, err)
		}
		out.store, out.redis, out.display, out.kind = rs, rs, dsn.Redact(f.raw), "redis"
		return out, nil
	}
	db, err := target.Open(ctx)
	if err != nil {
		return nil, fmt.Errorf("-%s: open %w", f.name, err)
	}
	out.closers = append(out.closers, db.Close)
	ss, err := sqlstore.New(db, &sqlstore.Config{Dialect: target.Dialect, Logger: log})
	if err != nil {
		out.Close()
		return nil, err
	}
	out.closers = append(out.closers, ss.Close)
	if o.migrate {
		if err := ss.Migrate(ctx); err != nil {
			out.Close()
			return nil, fmt.Errorf("-%s %s: migrate: %w", f.name, target.Display, err)
		}
	}
	out.store, out.sql, out.db, out.dialect, out.display, out.kind = ss, ss, db, target.Dialect, target.Display, target.Dialect.String()
	if cacheOpts != nil {
		rdb := redis.NewClient(cacheOpts)
		out.closers = append(out.closers, rdb.Close)
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if err := rdb.Ping(pctx).Err(); err != nil {
			// The tiered store runs on the database alone while Redis is away.
			log.Warn("Redis does not answer; serving from the database until it does", "cache", dsn.Redact(f.cache), "error", err)
		}
		cancel()
		ts, err := tieredstore.New(rdb, ss, &tieredstore.Config{Logger: log})
		if err != nil {
			out.Close()
			return nil, fmt.Errorf("-cache: %w", err)
		}
		out.store, out.kind = ts, "tiered"
		out.display += ", cache " + dsn.Redact(f.cache)
	}
	return out, nil
}

// hashScope is the scope the proxy gives a request whose scope header
// holds value: the hex SHA-256 of the value, so that an API key never
// lands in the store.
func hashScope(value string) string {
	sum := sha256.Sum256([]byte(value))
	return hex.EncodeToString(sum[:])
}

// errMissingTables tells a command that needs idem's tables to migrate.
var errMissingTables = errors.New("idem's tables are missing: run 'idem migrate -db …' first")
