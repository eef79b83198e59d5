package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testenv"
)

// TestMySQLUpsertReport pins what the MySQL acquire upsert reports in its
// OK packet, on which Acquire relies: an insert reports the database's now
// as its insert id with one affected row; an update reports
// mysqlTookProcessing, mysqlReplaced, or 0 when it leaves the row alone,
// never an insert id that reads as an insert. Under the server's default
// sql_mode, and under SIMULTANEOUS_ASSIGNMENT with clientFoundRows (an
// unchanged row counts as one affected row, as an insert does).
func TestMySQLUpsertReport(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		params map[string]string
		found  bool
	}{
		{"server default", nil, false},
		{"SIMULTANEOUS_ASSIGNMENT+clientFoundRows", map[string]string{"sql_mode": "'SIMULTANEOUS_ASSIGNMENT'"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := mysql.ParseDSN(testenv.MySQL.Need(t))
			if err != nil {
				t.Fatal(err)
			}
			cfg.Params, cfg.ClientFoundRows = c.params, c.found
			db, err := sql.Open("mysql", cfg.FormatDSN())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			var myErr *mysql.MySQLError
			if err := db.PingContext(ctx); errors.As(err, &myErr) && myErr.Number == 1231 {
				t.Skipf("the server does not know this sql_mode: %v", err)
			} else if err != nil {
				testenv.Unavailable(t, testenv.MySQL.Name, testenv.MySQL.Var, err)
			}
			s, err := New(db, &Config{Dialect: MySQL})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			scope := "upsert-" + idem.NewOwner()
			// upsert runs the acquire statement on key and checks its
			// report: the insert id (wantID, or the database's now for an
			// insert when wantID < 0) and the affected rows. Every wait
			// below only lets a lease or a retention run out: a slow
			// machine cannot change an outcome.
			since := time.Now().Add(-time.Minute).UnixMilli()
			upsert := func(what, key, fp string, lease, retention time.Duration, wantID, wantRows int64) {
				t.Helper()
				v := values{scope: scope, key: key, fingerprint: fp, owner: idem.NewOwner(), leaseMS: ceilMS(lease), retentionMS: ceilMS(retention)}
				res, err := s.exec(ctx, nil, s.st.acquire, &v)
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				id, err := res.LastInsertId()
				if err != nil {
					t.Fatal(err)
				}
				n, err := res.RowsAffected()
				if err != nil {
					t.Fatal(err)
				}
				if wantID < 0 {
					if id < since || id > time.Now().Add(time.Minute).UnixMilli() {
						t.Fatalf("%s: insert id %d, want the database's now", what, id)
					}
					wantID = id
				}
				if id != wantID || n != wantRows {
					t.Fatalf("%s: insert id %d, %d rows affected; want %d, %d", what, id, n, wantID, wantRows)
				}
			}
			complete := func(key string, retention time.Duration) {
				t.Helper()
				rec, err := s.Get(ctx, scope, key)
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Complete(ctx, idem.Lease{Scope: scope, Key: key, Owner: rec.Owner, Fence: rec.Fence}, idem.Response{StatusCode: 200}, retention); err != nil {
					t.Fatal(err)
				}
			}
			unchanged := int64(0)
			if c.found {
				unchanged = 1
			}

			upsert("insert", "live", "fp", time.Minute, time.Minute, -1, 1)
			upsert("live lease", "live", "fp", time.Minute, time.Minute, 0, unchanged)
			complete("live", time.Hour)
			upsert("live completed", "live", "fp", time.Minute, time.Minute, 0, unchanged)

			upsert("insert", "k", "fp", 50*time.Millisecond, time.Hour, -1, 1)
			time.Sleep(70 * time.Millisecond)
			upsert("other fingerprint, lease ended", "k", "other", time.Minute, time.Minute, 0, unchanged)
			upsert("takeover", "k", "fp", 50*time.Millisecond, 50*time.Millisecond, mysqlTookProcessing, 2)
			time.Sleep(120 * time.Millisecond)
			upsert("abandoned, other fingerprint", "k", "other", time.Minute, time.Minute, mysqlTookProcessing, 2)
			complete("k", 50*time.Millisecond)
			time.Sleep(70 * time.Millisecond)
			upsert("expired completed", "k", "third", time.Minute, time.Minute, mysqlReplaced, 2)
			if rec, err := s.Get(ctx, scope, "k"); err != nil || rec.Fence != 4 || rec.Fingerprint != "third" || rec.Status != idem.StatusProcessing || rec.Response != nil {
				t.Fatalf("after the upserts: %+v, %v; want fence 4, fingerprint third, processing", rec, err)
			}
		})
	}
}
