// Package dsn parses the database and Redis addresses that idem's
// programs (shopd, idem) take on their command lines, and opens them.
//
// A database is one of
//
//	sqlite:PATH                              a SQLite file (its directory is created)
//	postgres://user:pass@host:port/db?…      PostgreSQL (postgresql:// too), as pgx reads it
//	mysql://user:pass@host:port/db?…         MySQL/MariaDB; the query holds go-sql-driver parameters
//	mysql:user:pass@tcp(host:port)/db?…      MySQL/MariaDB, a raw go-sql-driver DSN
//
// and Redis is redis://[user:pass@]host:port/db (rediss:// for TLS), as
// go-redis' ParseURL reads it. Parsing validates a value without
// connecting; no error shows a password.
package dsn

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

// Pool limits of a server database (PostgreSQL, MySQL) opened by Open.
// SQLite keeps sqlite.Open's single connection (see sqlstore's doc).
const (
	MaxOpenConns    = 16
	maxIdleConns    = 16
	connMaxIdleTime = 5 * time.Minute
	// Below MySQL's default wait_timeout (8 h) and any proxy's idle cut.
	connMaxLifetime = 30 * time.Minute
)

// DB is a parsed database value: which database to open, and how.
type DB struct {
	// Dialect is the database's sqlstore dialect.
	Dialect sqlstore.Dialect
	// SQLitePath is the file of a SQLite database.
	SQLitePath string
	// PostgresURL is a PostgreSQL URL for pgx.
	PostgresURL string
	// MySQL is a go-sql-driver configuration.
	MySQL *mysql.Config
	// Display describes the database without its password.
	Display string
}

// ParseDB parses a database value (see the package doc). It validates the
// value without connecting.
func ParseDB(raw string) (DB, error) {
	switch {
	case strings.HasPrefix(raw, "sqlite:"):
		path := strings.TrimPrefix(raw, "sqlite:")
		switch {
		case path == "":
			return DB{}, errors.New("sqlite: needs a file path, e.g. sqlite:./data/idem.db")
		case strings.HasPrefix(path, "//"):
			return DB{}, fmt.Errorf("%q: write sqlite:PATH, not a URL", raw)
		case path == ":memory:" || strings.HasPrefix(path, "file:") || strings.ContainsAny(path, "?\x00"):
			return DB{}, fmt.Errorf("%q: PATH must be a plain file path (no ':memory:', 'file:' or '?')", raw)
		}
		return DB{Dialect: sqlstore.SQLite, SQLitePath: path, Display: "sqlite:" + path}, nil

	case strings.HasPrefix(raw, "postgres://"), strings.HasPrefix(raw, "postgresql://"):
		u, err := url.Parse(raw)
		if err != nil {
			return DB{}, fmt.Errorf("PostgreSQL URL: %v", RedactErr(err, raw))
		}
		if _, err := pgx.ParseConfig(raw); err != nil {
			return DB{}, fmt.Errorf("PostgreSQL URL %s: %v", redactURL(u), RedactErr(err, raw))
		}
		// pgx fills a missing host or database with libpq's defaults (a
		// local server, a database named after the OS user): a program
		// would migrate a database nobody named.
		q := u.Query()
		if u.Hostname() == "" && q.Get("host") == "" {
			return DB{}, fmt.Errorf("PostgreSQL URL %s has no host (postgres://user:pass@HOST:port/db, or ?host=/socket/dir)", redactURL(u))
		}
		db := strings.TrimPrefix(u.Path, "/")
		if q.Has("dbname") {
			db = q.Get("dbname")
		}
		if db == "" {
			return DB{}, fmt.Errorf("PostgreSQL URL %s must name its database: postgres://user:pass@host:port/DB", redactURL(u))
		}
		return DB{Dialect: sqlstore.PostgreSQL, PostgresURL: raw, Display: redactURL(u)}, nil

	case strings.HasPrefix(raw, "mysql://"):
		cfg, err := mysqlFromURL(raw)
		if err != nil {
			return DB{}, err
		}
		return DB{Dialect: sqlstore.MySQL, MySQL: cfg, Display: mysqlDisplay(cfg)}, nil

	case strings.HasPrefix(raw, "mysql:"):
		cfg, err := mysql.ParseDSN(strings.TrimPrefix(raw, "mysql:"))
		if err != nil {
			return DB{}, fmt.Errorf("MySQL DSN after 'mysql:': %v", RedactErr(err, raw))
		}
		if cfg.DBName == "" {
			return DB{}, fmt.Errorf("MySQL DSN %s must name its database: mysql:user:pass@tcp(host:port)/DB", mysqlDisplay(cfg))
		}
		return DB{Dialect: sqlstore.MySQL, MySQL: cfg, Display: mysqlDisplay(cfg)}, nil
	}
	return DB{}, fmt.Errorf("%q is not a database: use sqlite:PATH, postgres://…, postgresql://…, mysql://user:pass@host:port/db or mysql:DSN", Redact(raw))
}

// mysqlFromURL turns mysql://user:pass@host[:port]/db?params into a
// go-sql-driver configuration; params are the driver's DSN parameters
// (tls, timeout, …).
func mysqlFromURL(raw string) (*mysql.Config, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("MySQL URL: %v", RedactErr(err, raw))
	}
	if u.Host == "" {
		return nil, fmt.Errorf("MySQL URL %s has no host", redactURL(u))
	}
	if u.Fragment != "" {
		return nil, fmt.Errorf("MySQL URL %s has a fragment", redactURL(u))
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return nil, fmt.Errorf("MySQL URL %s must name one database: mysql://user:pass@host:port/DB", redactURL(u))
	}
	// The driver's own parser validates the parameters and fills defaults.
	cfg, err := mysql.ParseDSN("/?" + u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("MySQL URL %s: parameters: %v", redactURL(u), err)
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

// Redact hides what may be a password in a value echoed in an error: the
// password of a URL's user info, and the value of any parameter whose
// name ends in "password" (pgx reads ?password= and ?sslpassword= from a
// URL's query; a libpq keyword/value string has password=…).
func Redact(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		return redactURL(u)
	}
	if at := strings.LastIndexByte(raw, '@'); at >= 0 {
		return "…" + redactParams(raw[at:])
	}
	return redactParams(raw)
}

// RedactErr returns err's text with raw (which may hold a password)
// replaced by its redacted form, as written or quoted (net/url's errors
// quote the URL: a password with a '"' or a control character in it
// would show, escaped), and any password parameter hidden.
//
// A library may also quote a part of raw (go-redis quotes the URL without
// its fragment): the user info's password is hidden wherever it shows as
// ":PASSWORD@", as written or escaped.
func RedactErr(err error, raw string) string {
	redacted := Redact(raw)
	msg := strings.ReplaceAll(err.Error(), strconv.Quote(raw), strconv.Quote(redacted))
	msg = strings.ReplaceAll(msg, raw, redacted)
	return redactParams(hidePassword(msg, raw))
}

// hidePassword replaces in s the password userinfoPassword finds in raw,
// or in raw without its fragment (as net/url quotes it), wherever it
// shows as ":PASSWORD@", as written or escaped.
func hidePassword(s, raw string) string {
	beforeFragment, _, _ := strings.Cut(raw, "#")
	for _, pw := range []string{userinfoPassword(raw), userinfoPassword(beforeFragment)} {
		if pw == "" {
			continue
		}
		quoted := strconv.Quote(pw)
		s = strings.ReplaceAll(s, ":"+quoted[1:len(quoted)-1]+"@", ":xxxxx@")
		s = strings.ReplaceAll(s, ":"+pw+"@", ":xxxxx@")
	}
	return s
}

// userinfoPassword returns what raw, parsable or not, holds as a password
// in its user info: after the scheme (through "://", or the first ':'),
// the text between the first ':' and the last '@'.
func userinfoPassword(raw string) string {
	rest := raw
	if i := strings.Index(raw, "://"); i >= 0 {
		rest = raw[i+3:]
	} else if _, after, ok := strings.Cut(raw, ":"); ok {
		rest = after
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return ""
	}
	_, pw, _ := strings.Cut(rest[:at], ":")
	return pw
}

// redactURL is u without its user info's password, a password parameter
// or its fragment: no database or Redis URL has one, so a fragment is a
// password's tail after a '#' written unescaped. A user info that a '?'
// or '#' in the user name moved into the query or fragment is hidden too.
func redactURL(u *url.URL) string {
	c := *u
	c.Fragment, c.RawFragment = "", ""
	return redactParams(hidePassword(c.Redacted(), u.String()))
}

// passwordParam matches a password parameter, name=value, in a URL's
// query or a keyword/value string: the value runs to the next separator,
// or is single-quoted.
var passwordParam = regexp.MustCompile(`(?i)([a-z_%0-9]*password[ \t]*=[ \t]*)('(?:[^'\\]|\\.)*'?|[^\s&;#]*)`)

// redactParams hides the values of s's password parameters.
func redactParams(s string) string {
	return passwordParam.ReplaceAllString(s, "${1}xxxxx")
}

// Open opens and pings the database; a SQLite file's directory is
// created. A server database's pool holds at most MaxOpenConns
// connections.
func (t DB) Open(ctx context.Context) (*sql.DB, error) {
	var db *sql.DB
	switch t.Dialect {
	case sqlstore.SQLite:
		if dir := filepath.Dir(t.SQLitePath); dir != "" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, fmt.Errorf("data directory: %w", err)
			}
		}
		return sqlite.Open(ctx, t.SQLitePath)
	case sqlstore.PostgreSQL:
		var err error
		if db, err = sql.Open("pgx", t.PostgresURL); err != nil {
			return nil, err
		}
	case sqlstore.MySQL:
		conn, err := mysql.NewConnector(t.MySQL)
		if err != nil {
			return nil, err
		}
		db = sql.OpenDB(conn)
	default:
		return nil, fmt.Errorf("no database dialect %v", t.Dialect)
	}
	db.SetMaxOpenConns(MaxOpenConns)
	db.SetMaxIdleConns(maxIdleConns)
	db.SetConnMaxIdleTime(connMaxIdleTime)
	db.SetConnMaxLifetime(connMaxLifetime)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("%s: %w", t.Display, err)
	}
	return db, nil
}

// IsRedis reports whether raw is meant as a Redis address (redis://,
// rediss:// or unix://).
func IsRedis(raw string) bool {
	for _, p := range []string{"redis://", "rediss://", "unix://"} {
		if strings.HasPrefix(raw, p) {
			return true
		}
	}
	return false
}

// ParseRedis parses a Redis value, redis://[user:pass@]host:port/db (or
// rediss:// for TLS, unix:///path?db=N), as go-redis' ParseURL reads it,
// and returns its options (with ContextTimeoutEnabled set) and a display
// form without the password.
func ParseRedis(raw string) (*redis.Options, string, error) {
	opts, err := redis.ParseURL(raw)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %v (want redis://host:port/db)", Redact(raw), RedactErr(err, raw))
	}
	if u, err := url.Parse(raw); err == nil && u.Scheme != "unix" && u.Hostname() == "" {
		// go-redis would use localhost:6379, a Redis nobody named.
		return nil, "", fmt.Errorf("%s has no host (want redis://host:port/db)", Redact(raw))
	}
	// A stalled call ends on the socket at the caller's deadline too.
	opts.ContextTimeoutEnabled = true
	display := raw
	if u, err := url.Parse(raw); err == nil {
		display = redactURL(u)
	}
	return opts, display, nil
}
