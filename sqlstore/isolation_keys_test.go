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

// TestDistinctKeysUnderIsolationDefault: requests on different keys never
// conflict in the store's own statements, whatever isolation the sessions
// default to. Many goroutines acquire, renew and complete distinct keys
// of one scope on a fresh database: their keys share the leaf pages of
// idem_records_pkey, and under SERIALIZABLE PostgreSQL records the
// acquire statement's read of an absent key as a predicate lock on such
// a page, which every other key's insert into it conflicts with. Every
// call must succeed: no error, no "still contended", and every record
// completed. On PostgreSQL above READ COMMITTED the store runs its own
// statements at READ COMMITTED, and only there.
func TestDistinctKeysUnderIsolationDefault(t *testing.T) {
	for _, c := range append(isolationDefaults[:len(isolationDefaults):len(isolationDefaults)], isolationDefault{
		"sqlite", sqlstore.SQLite, func(t *testing.T) *sql.DB { db, _ := setup(t); return db }, false,
	}) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db := c.open(t)
			s, err := sqlstore.New(db, &sqlstore.Config{Dialect: c.dialect})
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			distinctKeys(t, s, "iso")
			rc, known := sqlstore.OwnStatementsInReadCommitted(s)
			checkWrapped(t, rc, known, c.wrapped)
		})
	}
}

func pgAt(level string) func(t *testing.T) *sql.DB {
	return func(t *testing.T) *sql.DB { db, _ := testdb.PostgresAt(t, level); return db }
}

func myAt(level string) func(t *testing.T) *sql.DB {
	return func(t *testing.T) *sql.DB { db, _ := testdb.MySQLAt(t, level); return db }
}

// distinctKeys runs workers goroutines that each acquire, renew and
// complete keys of their own, all at once, and then checks that every
// record is completed with its response.
func distinctKeys(t *testing.T, s *sqlstore.Store, scope string) {
	t.Helper()
	const workers, perWorker = 24, 8
	ctx := t.Context()
	concurrently(t, workers, perWorker, "distinct keys", func(w, i int) error {
		key := fmt.Sprintf("k-%02d-%02d", w, i)
		if err := acquireComplete(ctx, s, scope, key); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		return nil
	})
	for w := range workers {
		for i := range perWorker {
			key := fmt.Sprintf("k-%02d-%02d", w, i)
			rec, err := s.Get(ctx, scope, key)
			if err != nil || rec.Status != idem.StatusCompleted || rec.Response == nil || string(rec.Response.Body) != key {
				t.Fatalf("record %s = %+v, %v; want completed with its response", key, rec, err)
			}
		}
	}
}

func acquireComplete(ctx context.Context, s *sqlstore.Store, scope, key string) error {
	res, err := s.Acquire(ctx, idem.AcquireRequest{Scope: scope, Key: key, Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		return err
	}
	if res.Outcome != idem.Acquired {
		return fmt.Errorf("Acquire: %v, want Acquired", res.Outcome)
	}
	l, err := s.Extend(ctx, res.Lease, time.Minute)
	if err != nil {
		return fmt.Errorf("Extend: %w", err)
	}
	if err := s.Complete(ctx, l, idem.Response{StatusCode: 201, Body: []byte(key)}, time.Hour); err != nil {
		return fmt.Errorf("Complete: %w", err)
	}
	return nil
}
