package shop

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

// Pool limits of a server database (PostgreSQL, MySQL). SQLite keeps
// sqlite.Open's single connection (see sqlstore's doc).
const (
	serverMaxOpenConns    = 16
	serverMaxIdleConns    = 16
	serverConnMaxIdleTime = 5 * time.Minute
	// Below MySQL's default wait_timeout (8 h) and any proxy's idle cut.
	serverConnMaxLifetime = 30 * time.Minute
)

// dbTarget is a parsed -db value: which database to open, and how.
type dbTarget struct {
	dialect sqlstore.Dialect
	// sqlitePath is the file of a SQLite database.
	sqlitePath string
	// pgURL is a PostgreSQL URL for pgx.
	pgURL string
	// mysql is a go-sql-driver configuration.
	mysql *mysql.Config
	// display describes the database without its password.
	display string
}

// parseDB parses a -db value:
//
//	sqlite:PATH                              a SQLite file (its directory is created)
//	postgres://user:pass@host:port/db?…      PostgreSQL (postgresql:// too), as pgx reads it
//	mysql://user:pass@host:port/db?…         MySQL/MariaDB; the query holds go-sql-driver parameters
//	mysql:user:pass@tcp(host:port)/db?…      MySQL/MariaDB, a raw go-sql-driver DSN
//
// It validates the value without connecting.
func parseDB(raw string) (dbTarget, error) {
	switch {
	case strings.HasPrefix(raw, "sqlite:"):
		path := strings.TrimPrefix(raw, "sqlite:")
		switch {
		case path == "":
			return dbTarget{}, errors.New("sqlite: needs a file path, e.g. sqlite:./shopdata/shop.db")
		case strings.HasPrefix(path, "//"):
			return dbTarget{}, fmt.Errorf("%q: write sqlite:PATH, not a URL", raw)
		case path == ":memory:" || strings.HasPrefix(path, "file:") || strings.ContainsAny(path, "?\x00"):
			return dbTarget{}, fmt.Errorf("%q: PATH must be a plain file path (no ':memory:', 'file:' or '?')", raw)
		}
		return dbTarget{dialect: sqlstore.SQLite, sqlitePath: path, display: "sqlite:" + path}, nil

	case strings.HasPrefix(raw, "postgres://"), strings.HasPrefix(raw, "postgresql://"):
		u, err := url.Parse(raw)
		if err != nil {
			return dbTarget{}, fmt.Errorf("PostgreSQL URL: %v", redactErr(err, raw))
		}
		if _, err := pgx.ParseConfig(raw); err != nil {
			return dbTarget{}, fmt.Errorf("PostgreSQL URL %s: %v", u.Redacted(), redactErr(err, raw))
		}
		// pgx fills a missing host or database with libpq's defaults (a
		// local server, a database named after the OS user): shopd would
		// migrate a database nobody named.
		q := u.Query()
		if u.Hostname() == "" && q.Get("host") == "" {
			return dbTarget{}, fmt.Errorf("PostgreSQL URL %s has no host (postgres://user:pass@HOST:port/db, or ?host=/socket/dir)", u.Redacted())
		}
		db := strings.TrimPrefix(u.Path, "/")
		if q.Has("dbname") {
			db = q.Get("dbname")
		}
		if db == "" {
			return dbTarget{}, fmt.Errorf("PostgreSQL URL %s must name its database: postgres://user:pass@host:port/DB", u.Redacted())
		}
		return dbTarget{dialect: sqlstore.PostgreSQL, pgURL: raw, display: u.Redacted()}, nil

	case strings.HasPrefix(raw, "mysql://"):
		cfg, err := mysqlFromURL(raw)
		if err != nil {
			return dbTarget{}, err
		}
		return dbTarget{dialect: sqlstore.MySQL, mysql: cfg, display: mysqlDisplay(cfg)}, nil

	case strings.HasPrefix(raw, "mysql:"):
		cfg, err := mysql.ParseDSN(strings.TrimPrefix(raw, "mysql:"))
		if err != nil {
			return dbTarget{}, fmt.Errorf("MySQL DSN after 'mysql:': %v", redactErr(err, raw))
		}
		if cfg.DBName == "" {
			return dbTarget{}, fmt.Errorf("MySQL DSN %s must name its database: mysql:user:pass@tcp(host:port)/DB", mysqlDisplay(cfg))
		}
		return dbTarget{dialect: sqlstore.MySQL, mysql: cfg, display: mysqlDisplay(cfg)}, nil
	}
	return dbTarget{}, fmt.Errorf("%q is not a database: use sqlite:PATH, postgres://…, postgresql://…, mysql://user:pass@host:port/db or mysql:DSN", redact(raw))
}

// mysqlFromURL turns mysql://user:pass@host[:port]/db?params into a
// go-sql-driver configuration; params are the driver's DSN parameters
// (tls, timeout, …).
func mysqlFromURL(raw string) (*mysql.Config, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("MySQL URL: %v", redactErr(err, raw))
	}
	if u.Host == "" {
		return nil, fmt.Errorf("MySQL URL %s has no host", u.Redacted())
	}
	if u.Fragment != "" {
		return nil, fmt.Errorf("MySQL URL %s has a fragment", u.Redacted())
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return nil, fmt.Errorf("MySQL URL %s must name one database: mysql://user:pass@host:port/DB", u.Redacted())
	}
	// The driver's own parser validates the parameters and fills defaults.
	cfg, err := mysql.ParseDSN("/?" + u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("MySQL URL %s: parameters: %v", u.Redacted(), err)
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.Net = "tcp"
	cfg.Addr = u.Host
	if u.Port() == "" {
		cfg.Addr = net.JoinHostPort(u.Hostname(), "3306")
	}
	cfg.DBName = db
	return cfg, nil
}

func mysqlDisplay(cfg *mysql.Config) string {
	return "mysql://" + url.User(cfg.User).String() + "@" + cfg.Addr + "/" + cfg.DBName
}

// redact hides what may be a password in a value echoed in an error.
func redact(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		return u.Redacted()
	}
	if at := strings.LastIndexByte(raw, '@'); at >= 0 {
		return "…" + raw[at:]
	}
	return raw
}

// redactErr returns err's text with raw (which may hold a password)
// replaced by its redacted form.
func redactErr(err error, raw string) string {
	return strings.ReplaceAll(err.Error(), raw, redact(raw))
}

// open opens and pings the database; a SQLite file's directory is created.
func (t dbTarget) open(ctx context.Context) (*sql.DB, error) {
	var db *sql.DB
	switch t.dialect {
	case sqlstore.SQLite:
		if dir := filepath.Dir(t.sqlitePath); dir != "" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, fmt.Errorf("data directory: %w", err)
			}
		}
		return sqlite.Open(ctx, t.sqlitePath)
	case sqlstore.PostgreSQL:
		var err error
		if db, err = sql.Open("pgx", t.pgURL); err != nil {
			return nil, err
		}
	case sqlstore.MySQL:
		conn, err := mysql.NewConnector(t.mysql)
		if err != nil {
			return nil, err
		}
		db = sql.OpenDB(conn)
	default:
		return nil, fmt.Errorf("no database dialect %v", t.dialect)
	}
	db.SetMaxOpenConns(serverMaxOpenConns)
	db.SetMaxIdleConns(serverMaxIdleConns)
	db.SetConnMaxIdleTime(serverConnMaxIdleTime)
	db.SetConnMaxLifetime(serverConnMaxLifetime)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("%s: %w", t.display, err)
	}
	return db, nil
}

// parseRedis parses a -redis value, redis://[user:pass@]host:port/db (or
// rediss:// for TLS), as go-redis' ParseURL reads it.
func parseRedis(raw string) (*redis.Options, string, error) {
	opts, err := redis.ParseURL(raw)
	if err != nil {
		return nil, "", fmt.Errorf("-redis %s: %v (want redis://host:port/db)", redact(raw), redactErr(err, raw))
	}
	if u, err := url.Parse(raw); err == nil && u.Scheme != "unix" && u.Hostname() == "" {
		// go-redis would use localhost:6379, a Redis nobody named.
		return nil, "", fmt.Errorf("-redis %s has no host (want redis://host:port/db)", redact(raw))
	}
	// A stalled call ends on the socket at tieredstore's timeout too.
	opts.ContextTimeoutEnabled = true
	display := raw
	if u, err := url.Parse(raw); err == nil {
		display = u.Redacted()
	}
	return opts, display, nil
}
