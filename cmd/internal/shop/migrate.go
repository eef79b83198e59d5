package shop

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/sqlstore"
)

//go:embed migrations/*/*.sql
var migrationFS embed.FS

// Locks that serialise the shop's migrations across processes: an
// arbitrary constant for pg_advisory_xact_lock (not sqlstore's), and a
// GET_LOCK name on MySQL.
const (
	pgMigrateLock        = 4861075620931447319
	mysqlMigrateLock     = "idem_shop_migrate"
	mysqlMigrateLockWait = 30 * time.Second
)

type migration struct {
	version int
	name    string
	stmts   []string
}

// dialectDir names a dialect's directory under migrations/.
func dialectDir(d sqlstore.Dialect) string {
	switch d {
	case sqlstore.PostgreSQL:
		return "postgres"
	case sqlstore.MySQL:
		return "mysql"
	}
	return "sqlite"
}

func loadMigrations(d sqlstore.Dialect) ([]migration, error) {
	names, err := fs.Glob(migrationFS, "migrations/"+dialectDir(d)+"/*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var ms []migration
	for _, name := range names {
		base := name[strings.LastIndexByte(name, '/')+1:]
		version, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("shop: migration %s has no version prefix", base)
		}
		body, err := migrationFS.ReadFile(name)
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: version, name: base, stmts: splitStatements(string(body))})
	}
	return ms, nil
}

// splitStatements splits a migration file into statements, each ending
// with ';' at the end of a line; lines starting with "--" are comments.
// (The shop's migrations hold no ';' inside a statement.)
func splitStatements(src string) []string {
	var stmts []string
	var cur strings.Builder
	for line := range strings.Lines(src) {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		if strings.HasSuffix(trimmed, ";") {
			stmts = append(stmts, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		stmts = append(stmts, s)
	}
	return stmts
}

// Migrate creates or upgrades the shop's tables in db, which speaks
// dialect d (nil means SQLite). It is idempotent, and safe when several
// processes start at once on one database: on SQLite the migration is one
// write transaction (which holds the database's write lock), on
// PostgreSQL one transaction holding an advisory transaction lock, on
// MySQL (which commits each DDL statement by itself) a run holding
// GET_LOCK('idem_shop_migrate'), whose statements are safe to rerun.
func Migrate(ctx context.Context, db *sql.DB, d sqlstore.Dialect) error {
	if d == nil {
		d = sqlstore.SQLite
	}
	ms, err := loadMigrations(d)
	if err != nil {
		return err
	}
	switch d {
	case sqlstore.MySQL:
		err = migrateMySQL(ctx, db, ms)
	default:
		err = migrateTx(ctx, db, d, ms)
	}
	if err != nil {
		return fmt.Errorf("shop: migrate (%s): %w", d, err)
	}
	return nil
}

// migrateTx runs the migrations in one transaction (SQLite, PostgreSQL).
func migrateTx(ctx context.Context, db *sql.DB, d sqlstore.Dialect, ms []migration) error {
	opts := (*sql.TxOptions)(nil)
	if d == sqlstore.PostgreSQL {
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if d == sqlstore.PostgreSQL {
		if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", int64(pgMigrateLock)); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
	}
	if err := apply(ctx, tx, d, ms); err != nil {
		return err
	}
	return tx.Commit()
}

// migrateMySQL runs the migrations on one connection holding a named lock.
func migrateMySQL(ctx context.Context, db *sql.DB, ms []migration) (err error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", mysqlMigrateLock, int(mysqlMigrateLockWait/time.Second)).Scan(&got); err != nil {
		discard(conn) // the lock may or may not be held
		return fmt.Errorf("lock: %w", err)
	}
	if !got.Valid || got.Int64 != 1 {
		conn.Close()
		return fmt.Errorf("GET_LOCK(%q) not granted within %v", mysqlMigrateLock, mysqlMigrateLockWait)
	}
	defer func() {
		if _, rerr := conn.ExecContext(context.WithoutCancel(ctx), "DO RELEASE_LOCK(?)", mysqlMigrateLock); rerr != nil {
			discard(conn) // closing the session releases the lock
			return
		}
		conn.Close()
	}()
	return apply(ctx, conn, sqlstore.MySQL, ms)
}

// discard closes conn's session instead of returning it to the pool.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

type execQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// apply creates shop_schema_migrations and runs, in order, the migrations
// it does not record.
func apply(ctx context.Context, ex execQuerier, d sqlstore.Dialect, ms []migration) error {
	if _, err := ex.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS shop_schema_migrations (version INTEGER PRIMARY KEY)`); err != nil {
		return err
	}
	rows, err := ex.QueryContext(ctx, `SELECT version FROM shop_schema_migrations`)
	if err != nil {
		return err
	}
	applied := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return err
		}
		applied[v] = true
	}
	if err := rows.Close(); err != nil {
		return err
	}
	if err := rows.Err(); err != nil {
		return err
	}
	insert := rebind(d, `INSERT INTO shop_schema_migrations (version) VALUES (?)`)
	for _, m := range ms {
		if applied[m.version] {
			continue
		}
		for i, stmt := range m.stmts {
			if _, err := ex.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("%s, statement %d: %w", m.name, i+1, err)
			}
		}
		if _, err := ex.ExecContext(ctx, insert, m.version); err != nil {
			return fmt.Errorf("%s: record version: %w", m.name, err)
		}
	}
	return nil
}

// rebind turns a statement written with ? placeholders into d's: $1, $2 …
// on PostgreSQL, unchanged elsewhere. The shop's statements hold no '?'
// other than placeholders.
func rebind(d sqlstore.Dialect, q string) string {
	if d != sqlstore.PostgreSQL {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
