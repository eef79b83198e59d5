package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/sqlstore/sqlite"
)

func TestParseStatements(t *testing.T) {
	t.Parallel()
	st, err := parseStatements("x.sql", `preamble
-- name: acquire
-- params: scope key scope
-- a comment
SELECT ?1, ?2, ?3;
`)
	if err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("incomplete file: %v, %v", st, err)
	}
	for _, bad := range []string{
		"-- name: nope\nSELECT 1;",
		"-- name: acquire\n-- params: scope nope\nSELECT 1;",
		"-- name: acquire\nSELECT 1;\n-- name: acquire\nSELECT 2;",
	} {
		if _, err := parseStatements("x.sql", bad); err == nil {
			t.Errorf("parseStatements(%q) succeeded", bad)
		}
	}
	a := sqliteStatements.acquire
	if len(a.params) != 6 || a.params[0] != pScope || strings.HasSuffix(a.text, ";") || strings.Contains(a.text, "-- ") {
		t.Fatalf("acquire = %+v", a)
	}
	got := a.args(&values{scope: "s", key: "k", fingerprint: "f", owner: "o", leaseMS: 5, retentionMS: 6})
	if len(got) != 6 || got[0] != "s" || got[4] != int64(5) || got[5] != int64(6) {
		t.Fatalf("args = %v", got)
	}
}

func TestLoadMigrations(t *testing.T) {
	t.Parallel()
	ms := SQLite.migrations()
	if len(ms) == 0 || ms[0].version != 1 || ms[0].name != "create_idem_records" || len(ms[0].stmts) != 2 {
		t.Fatalf("sqlite migrations = %+v", ms)
	}
	for _, bad := range []fstest.MapFS{
		{"m/0002_x.sql": {Data: []byte("SELECT 1;")}},
		{"m/x.sql": {Data: []byte("SELECT 1;")}},
		{"m/0001_x.sql": {Data: []byte("-- only a comment;\n")}},
		{"m/0001_x.sql": {Data: []byte("SELECT 1;")}, "m/001_y.sql": {Data: []byte("SELECT 1;")}},
	} {
		if ms, err := loadMigrations(bad, "m"); err == nil {
			t.Errorf("loadMigrations(%v) = %+v", bad, ms)
		}
	}
	got := splitStatements("-- c\nCREATE TABLE a (x INT);\n\n-- d\nCREATE INDEX b ON a (x);\n-- trailing\n")
	if len(got) != 2 || !strings.HasSuffix(got[1], "ON a (x)") {
		t.Fatalf("splitStatements = %q", got)
	}
	fn := "CREATE FUNCTION f() RETURNS int\nLANGUAGE plpgsql AS $$\nBEGIN\n    RETURN 1;\nEND\n$$;\nSELECT f();\n"
	got = splitStatements(fn)
	if len(got) != 2 || !strings.HasSuffix(got[0], "END\n$$") || got[1] != "SELECT f()" {
		t.Fatalf("splitStatements(function) = %q", got)
	}
	if ms := postgresMigrations; len(ms) < 2 || len(ms[1].stmts) != 1 {
		t.Fatalf("postgres migration 2 splits into %d statements, want 1", len(ms[1].stmts))
	}
}

// TestQueryPlans pins that every statement on idem_records finds its rows
// by an index, never by a scan of the table.
func TestQueryPlans(t *testing.T) {
	t.Parallel()
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "plan.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, _ := New(db, &Config{Dialect: SQLite})
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	st := SQLite.statements()
	v := &values{scope: "s", key: "k", owner: "o", fence: 1, leaseMS: 1, retentionMS: 1, limit: 10}
	for _, q := range []*query{st.selectRecord, st.complete, st.extend, st.release, st.deleteRecord, st.sweep} {
		rows, err := db.QueryContext(t.Context(), "EXPLAIN QUERY PLAN "+q.text, q.args(v)...)
		if err != nil {
			t.Fatalf("%s: %v", q.name, err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		text := strings.Join(plan, "; ")
		if strings.Contains(text, "SCAN idem_records") && !strings.Contains(text, "USING INDEX") {
			t.Errorf("%s scans the table: %s", q.name, text)
		}
		if q == st.sweep && !strings.Contains(text, "idem_records_expires_at") {
			t.Errorf("sweep does not use idem_records_expires_at: %s", text)
		}
		t.Logf("%s: %s", q.name, text)
	}
}

type stateErr string

func (e stateErr) Error() string    { return "ERROR: x (SQLSTATE " + string(e) + ")" }
func (e stateErr) SQLState() string { return string(e) }

// TestErrorCodes pins how the server dialects read driver errors:
// PostgreSQL's through their SQLState method, MySQL's as *mysql.MySQLError
// (TestMySQLErrorClassification has the server's own).
func TestErrorCodes(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("a: %w", fmt.Errorf("b: %w", err)) }
	if !PostgreSQL.retryable(wrap(stateErr("40001"))) || !PostgreSQL.retryable(stateErr("40P01")) || PostgreSQL.retryable(stateErr("23505")) {
		t.Error("PostgreSQL.retryable")
	}
	if !PostgreSQL.missingTable(wrap(stateErr("42P01"))) || PostgreSQL.missingTable(errors.New("relation does not exist")) {
		t.Error("PostgreSQL.missingTable")
	}
	deadlock := &mysql.MySQLError{Number: 1213, Message: "Deadlock found when trying to get lock; try restarting transaction"}
	if !MySQL.retryable(wrap(deadlock)) || MySQL.retryable(&mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded"}) || MySQL.retryable(errors.New("deadlock")) {
		t.Error("MySQL.retryable")
	}
	if !MySQL.missingTable(wrap(&mysql.MySQLError{Number: 1146, Message: "Table 'test.idem_records' doesn't exist"})) || MySQL.missingTable(errors.New("Error 1146")) {
		t.Error("MySQL.missingTable")
	}
	for _, d := range []Dialect{SQLite, PostgreSQL, MySQL} {
		if ms := d.migrations(); len(ms) == 0 || ms[0].name != "create_idem_records" {
			t.Errorf("%s migrations = %+v", d, ms)
		}
		if st := d.statements(); (st.selectLease.text != "") != (d == MySQL) {
			t.Errorf("%s: select_lease = %q", d, st.selectLease.text)
		}
		if st := d.statements(); (st.selectHeld.text == "") != (d == PostgreSQL) {
			t.Errorf("%s: select_held = %q", d, st.selectHeld.text)
		}
	}
}

// TestRetryable: the exported classifier answers for every dialect's
// errors, wrapped or joined, and for nothing else.
func TestRetryable(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("commit: %w", err) }
	for _, err := range []error{
		stateErr("40001"), wrap(stateErr("40P01")),
		wrap(&mysql.MySQLError{Number: 1213, Message: "Deadlock found"}),
		errors.Join(errors.New("x"), stateErr("40001")),
	} {
		if !Retryable(err) {
			t.Errorf("Retryable(%v) = false", err)
		}
	}
	for _, err := range []error{
		nil, errors.New("40001 deadlock"), stateErr("23505"), stateErr("57014"),
		&mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded"},
		&mysql.MySQLError{Number: 1062, Message: "Duplicate entry"},
	} {
		if Retryable(err) {
			t.Errorf("Retryable(%v) = true", err)
		}
	}
}
