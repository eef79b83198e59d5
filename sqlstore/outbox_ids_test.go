package sqlstore_test

import (
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/sqlstore"
)

// migrationVersion is the version of the migration named name on d.
func migrationVersion(t *testing.T, d sqlstore.Dialect, name string) int64 {
	t.Helper()
	for i, n := range sqlstore.MigrationNames(d) {
		if strings.HasSuffix(n, "_"+name) {
			return int64(i + 1)
		}
	}
	t.Fatalf("%s: no migration %s", d, name)
	return 0
}

// migratedBefore returns a database of the test's own, migrated as the
// build before the migration named name left it.
func migratedBefore(t *testing.T, srv server, name string) *sql.DB {
	t.Helper()
	db, _ := outboxDB(t, srv)
	old, err := sqlstore.New(db, &sqlstore.Config{Dialect: srv.dialect})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := sqlstore.MigrateTo(t.Context(), old, migrationVersion(t, srv.dialect, name)-1); err != nil {
		t.Fatal(err)
	}
	return db
}

// msgIDVersion is the version of the migration that adds
// idem_outbox.msg_id on d.
func msgIDVersion(t *testing.T, d sqlstore.Dialect) int64 {
	t.Helper()
	return migrationVersion(t, d, "outbox_msg_id")
}

// claimAll claims, returns the IDs, and marks them sent if mark (else
// releases them: a publish whose mark was lost).
func claimAll(t *testing.T, s *sqlstore.OutboxStore, mark bool) []string {
	t.Helper()
	b, err := s.Claim(t.Context(), 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range b.Messages() {
		got = append(got, m.ID)
	}
	if mark {
		err = b.MarkSent(t.Context(), got)
	} else {
		err = b.Release(t.Context())
	}
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestOutboxLegacyRows: a row that a build before msg_id added, pending
// when the migration runs, keeps the ID that build published it with
// (IDPrefix and the row's id), at every claim, and is marked by it; the
// rows added after the migration have IDs of their own, stored in the
// row.
func TestOutboxLegacyRows(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		ctx := t.Context()
		db := migratedBefore(t, srv, "outbox_msg_id")
		// The older build's insert.
		if _, err := db.ExecContext(ctx, srv.rebind(`INSERT INTO idem_outbox (topic, msg_key, payload, created_at) VALUES (?, ?, ?, 1)`), "order.paid", "o-1", []byte("p")); err != nil {
			t.Fatal(err)
		}
		var row int64
		if err := db.QueryRowContext(ctx, `SELECT max(id) FROM idem_outbox`).Scan(&row); err != nil {
			t.Fatal(err)
		}
		legacy := fmt.Sprintf("eu/%d", row)

		s := newOutboxStore(t, db, sqlstore.OutboxConfig{Dialect: srv.dialect, IDPrefix: "eu/"}) // migrates
		if srv.dialect == sqlstore.MySQL {
			// MySQL commits DDL by itself: a Migrate interrupted after
			// the ALTER and before the version's record runs it again,
			// harmlessly.
			if _, err := db.ExecContext(ctx, `DELETE FROM idem_schema_migrations WHERE version = ?`, msgIDVersion(t, srv.dialect)); err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("Migrate again after an interruption: %v", err)
			}
		}
		added, err := addTx(ctx, db, s, false, outbox.Message{Topic: "order.closed", Key: "o-1"}, outbox.Message{Topic: "order.paid", Key: "o-2"})
		if err != nil {
			t.Fatal(err)
		}
		for range 2 { // published, its mark lost, published again
			if got, want := claimAll(t, s, false), []string{legacy, added[1]}; !slices.Equal(got, want) {
				t.Fatalf("Claim = %q, want the legacy row as %q and then %q", got, want, added[1])
			}
		}
		var msgID sql.NullString
		if err := db.QueryRowContext(ctx, srv.rebind(`SELECT msg_id FROM idem_outbox WHERE id = ?`), row).Scan(&msgID); err != nil || msgID.Valid {
			t.Fatalf("legacy row's msg_id = %v, %v; want NULL", msgID, err)
		}
		if got, want := claimAll(t, s, true), []string{legacy, added[1]}; !slices.Equal(got, want) {
			t.Fatalf("Claim = %q, want %q", got, want)
		}
		if got, want := claimAll(t, s, true), added[:1]; !slices.Equal(got, want) {
			t.Fatalf("after the legacy row was marked, Claim = %q, want %q", got, want)
		}
		if n := pendingCount(t, db); n != 0 {
			t.Fatalf("%d pending, want 0", n)
		}
	})
}

// TestOutboxRowIDsReused: a database restored from a backup (or its
// table emptied and its sequence reset) gives the row ids of the lost
// messages again to new ones; their IDs are new all the same, so a
// broker or an inbox that saw the lost messages does not drop them.
func TestOutboxRowIDsReused(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		ctx := t.Context()
		db, _ := outboxDB(t, srv)
		s := newOutboxStore(t, db, sqlstore.OutboxConfig{Dialect: srv.dialect, IDPrefix: "eu/"})
		rowIDs := func() []int64 {
			rows, err := db.QueryContext(ctx, `SELECT id FROM idem_outbox ORDER BY id`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var out []int64
			for rows.Next() {
				var id int64
				if err := rows.Scan(&id); err != nil {
					t.Fatal(err)
				}
				out = append(out, id)
			}
			return out
		}
		var lost []string
		var lostRows []int64
		for round := range 2 {
			msgs := []outbox.Message{{Topic: "order.paid", Key: "o-1"}, {Topic: "order.paid", Key: "o-2"}}
			ids, err := addTx(ctx, db, s, false, msgs...)
			if err != nil {
				t.Fatal(err)
			}
			if got := claimAll(t, s, true); !slices.Equal(got, ids) {
				t.Fatalf("Claim = %q, want the IDs Add returned %q", got, ids)
			}
			if round == 1 {
				if got := rowIDs(); !slices.Equal(got, lostRows) {
					t.Fatalf("row ids %v after the restore, want the lost ones %v again", got, lostRows)
				}
				for _, id := range ids {
					if slices.Contains(lost, id) {
						t.Fatalf("ID %q of a lost message given again after the restore (IDs %q, lost %q)", id, ids, lost)
					}
				}
				break
			}
			lost, lostRows = ids, rowIDs()
			// Back to the backup, taken before these messages.
			reset := map[sqlstore.Dialect][]string{
				sqlstore.PostgreSQL: {`DELETE FROM idem_outbox`, `ALTER TABLE idem_outbox ALTER COLUMN id RESTART WITH 1`},
				sqlstore.MySQL:      {`DELETE FROM idem_outbox`, `ALTER TABLE idem_outbox AUTO_INCREMENT = 1`},
				sqlstore.SQLite:     {`DELETE FROM idem_outbox`, `DELETE FROM sqlite_sequence WHERE name = 'idem_outbox'`},
			}[srv.dialect]
			for _, q := range reset {
				if _, err := db.ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
		}
	})
}
