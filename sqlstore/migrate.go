package sqlstore

import (
	"context"
	"fmt"
	"math"
)

// Migrate brings the database's schema to the version this package knows:
// it applies, in order, the dialect's embedded migrations not yet recorded
// in idem_schema_migrations, all in one write transaction on SQLite and
// PostgreSQL, which roll DDL back with it. MySQL commits each DDL
// statement by itself: there the migrations run one statement at a time,
// each written so that a rerun after an interruption is harmless. It is
// idempotent, and safe to call from several goroutines or processes at
// once: it holds the database's write lock on SQLite (BEGIN IMMEDIATE), a
// transaction-level advisory lock on PostgreSQL and
// GET_LOCK('idem_migrate') on MySQL, so one caller migrates and the
// others then find nothing to do. A database migrated by a newer build, with versions this build
// does not know, is left as it is.
func (s *Store) Migrate(ctx context.Context) error {
	return s.migrate(ctx, math.MaxInt64)
}

// migrate applies the migrations not yet applied up to version upTo.
func (s *Store) migrate(ctx context.Context, upTo int64) error {
	const op = "migrate"
	if err := s.closed(op); err != nil {
		return err
	}
	tx, err := s.d.beginSchema(ctx, s.db)
	if err != nil {
		return s.fail(ctx, op, err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit

	if q := s.st.lockSchema; q.text != "" {
		if _, err := tx.ExecContext(ctx, q.text); err != nil {
			return s.fail(ctx, op+": lock schema", err)
		}
	}
	if _, err := tx.ExecContext(ctx, s.st.createMigrationsTable.text); err != nil {
		return s.fail(ctx, op+": create idem_schema_migrations", err)
	}
	applied := map[int64]bool{}
	rows, err := tx.QueryContext(ctx, s.st.selectMigrations.text)
	if err != nil {
		return s.fail(ctx, op+": read idem_schema_migrations", err)
	}
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return s.fail(ctx, op+": read idem_schema_migrations", err)
		}
		applied[v] = true
	}
	if err := rows.Close(); err != nil {
		return s.fail(ctx, op+": read idem_schema_migrations", err)
	}
	if err := rows.Err(); err != nil {
		return s.fail(ctx, op+": read idem_schema_migrations", err)
	}

	var done []migration
	for _, m := range s.d.migrations() {
		if applied[m.version] || m.version > upTo {
			continue
		}
		for i, stmt := range m.stmts {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return s.fail(ctx, fmt.Sprintf("%s: %s %04d_%s, statement %d", op, s.d, m.version, m.name, i+1), err)
			}
		}
		v := values{version: m.version, name: m.name}
		if _, err := tx.ExecContext(ctx, s.st.insertMigration.text, s.st.insertMigration.args(&v)...); err != nil {
			return s.fail(ctx, fmt.Sprintf("%s: record %04d_%s", op, m.version, m.name), err)
		}
		done = append(done, m)
	}
	if err := tx.Commit(); err != nil {
		return s.fail(ctx, op+": commit", err)
	}
	for _, m := range done {
		s.log.InfoContext(ctx, "sqlstore: migration applied", "dialect", s.d.String(), "version", m.version, "name", m.name)
	}
	return nil
}
