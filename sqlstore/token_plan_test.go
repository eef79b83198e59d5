package sqlstore

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem/sqlstore/sqlite"
)

// TestTokenQueryPlans pins that every statement on idem_tokens finds its
// rows by the primary key or an index, never by a scan, and that Trim
// walks the partial index of unused tokens (a scope's used tokens cost it
// nothing).
func TestTokenQueryPlans(t *testing.T) {
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
	v := &values{scope: "s", digest: strings.Repeat("a", 64), result: []byte("r"), ttlMS: 1, limit: 10}
	for _, q := range []*query{st.tokenConsume, st.tokenSelect, st.tokenSweep, st.tokenTrim} {
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
		if strings.Contains(text, "SCAN idem_tokens") && !strings.Contains(text, "USING") {
			t.Errorf("%s scans the table: %s", q.name, text)
		}
		if q == st.tokenSweep && !strings.Contains(text, "idem_tokens_expires_at") {
			t.Errorf("token_sweep does not use idem_tokens_expires_at: %s", text)
		}
		if q == st.tokenTrim && !strings.Contains(text, "idem_tokens_scope_expires_at") {
			t.Errorf("token_trim does not use idem_tokens_scope_expires_at: %s", text)
		}
		t.Logf("%s: %s", q.name, text)
	}
}
