package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/sqlstore"
)

// List returns the oldest records first, filtered by status, at most
// limit, with their responses; on a database of the test's own, so that
// other tests' records stay out of it.
func TestList(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		dialect sqlstore.Dialect
		open    func(t *testing.T) *sql.DB
	}{
		{sqlstore.SQLite, func(t *testing.T) *sql.DB { db, _ := setup(t); return db }},
		{sqlstore.PostgreSQL, func(t *testing.T) *sql.DB { db, _ := testdb.Postgres(t); return db }},
		{sqlstore.MySQL, func(t *testing.T) *sql.DB { db, _ := testdb.MySQL(t); return db }},
	} {
		t.Run(c.dialect.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s, err := sqlstore.New(c.open(t), &sqlstore.Config{Dialect: c.dialect})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if recs, err := s.List(ctx, "", 10); err != nil || len(recs) != 0 {
				t.Fatalf("List of an empty table: %v, %v", recs, err)
			}
			// k0 … k4, created in that order (records created in the
			// same millisecond come in key order); k1 and k3 completed.
			var leases []idem.Lease
			for i := range 5 {
				res, err := s.Acquire(ctx, idem.AcquireRequest{Scope: "tenant", Key: fmt.Sprintf("k%d", i), Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
				if err != nil || res.Outcome != idem.Acquired {
					t.Fatalf("Acquire k%d: %+v, %v", i, res, err)
				}
				leases = append(leases, res.Lease)
			}
			for _, i := range []int{1, 3} {
				resp := idem.Response{StatusCode: 201, Header: map[string][]string{"Content-Type": {"text/plain"}}, Body: []byte(fmt.Sprintf("body %d", i))}
				if err := s.Complete(ctx, leases[i], resp, time.Hour); err != nil {
					t.Fatal(err)
				}
			}
			keys := func(recs []idem.Record) []string {
				var ks []string
				for _, r := range recs {
					ks = append(ks, r.Key)
				}
				return ks
			}
			for _, q := range []struct {
				status idem.Status
				limit  int
				want   string
			}{
				{"", 0, "[k0 k1 k2 k3 k4]"},
				{"", 2, "[k0 k1]"},
				{idem.StatusProcessing, 10, "[k0 k2 k4]"},
				{idem.StatusCompleted, 10, "[k1 k3]"},
				{idem.StatusCompleted, 1, "[k1]"},
			} {
				recs, err := s.List(ctx, q.status, q.limit)
				if err != nil {
					t.Fatalf("List(%q, %d): %v", q.status, q.limit, err)
				}
				if got := fmt.Sprint(keys(recs)); got != q.want {
					t.Errorf("List(%q, %d) = %s, want %s", q.status, q.limit, got, q.want)
				}
				for _, r := range recs {
					if r.Scope != "tenant" || r.Fingerprint != "fp" {
						t.Errorf("record %+v", r)
					}
					if r.Status == idem.StatusCompleted && (r.Response == nil || string(r.Response.Body) != "body "+r.Key[1:] || fmt.Sprint(r.Response.Header["Content-Type"]) != "[text/plain]") {
						t.Errorf("completed record %s: response %+v", r.Key, r.Response)
					}
					if r.Status == idem.StatusProcessing && (r.Owner == "" || !r.LeaseUntil.After(r.CreatedAt)) {
						t.Errorf("processing record %s: %+v", r.Key, r)
					}
				}
			}
			if _, err := s.List(ctx, "done", 1); err == nil {
				t.Error("List with an unknown status: no error")
			}
		})
	}
}
