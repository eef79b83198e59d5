package guardtest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/uniq"
)

// uniqSchema creates the tables of the uniq tests: customers; orders,
// with a unique index on ref and another on email, a check and a foreign
// key; items, whose primary key is its sku.
func uniqSchema(t testing.TB, s server) *sql.DB {
	t.Helper()
	db := s.open(t)
	id := map[dialect]string{
		postgres: "BIGSERIAL PRIMARY KEY",
		mysql:    "BIGINT AUTO_INCREMENT PRIMARY KEY",
		sqlite3:  "INTEGER PRIMARY KEY AUTOINCREMENT",
	}[s.dialect]
	execAll(t, db,
		`CREATE TABLE customers (id BIGINT PRIMARY KEY)`,
		`CREATE TABLE orders (
			id `+id+`,
			ref VARCHAR(64) NOT NULL,
			email VARCHAR(64),
			amount INT NOT NULL CHECK (amount >= 0),
			customer_id BIGINT REFERENCES customers (id)
		)`,
		`CREATE UNIQUE INDEX orders_ref ON orders (ref)`,
		`CREATE UNIQUE INDEX orders_email ON orders (email)`,
		`CREATE TABLE items (sku VARCHAR(64) PRIMARY KEY, name VARCHAR(64) NOT NULL)`,
		`INSERT INTO customers (id) VALUES (1)`,
	)
	return db
}

// An order as the tests insert and read it.
type order struct {
	ID     int64
	Ref    string
	Amount int
}

// insertOrder returns an insert function for InsertOrGet: one statement
// (INSERT … RETURNING where the dialect has it).
func insertOrder(d dialect, ref, email string, amount int) func(context.Context, uniq.Querier) (order, error) {
	return func(ctx context.Context, q uniq.Querier) (order, error) {
		o := order{Ref: ref, Amount: amount}
		var em any
		if email != "" {
			em = email
		}
		const ins = `INSERT INTO orders (ref, email, amount) VALUES (?, ?, ?)`
		if d == mysql {
			res, err := q.ExecContext(ctx, ins, ref, em, amount)
			if err != nil {
				return order{}, err
			}
			o.ID, err = res.LastInsertId()
			return o, err
		}
		err := q.QueryRowContext(ctx, rebind(d, ins+` RETURNING id`), ref, em, amount).Scan(&o.ID)
		return o, err
	}
}

// getOrder returns a get function for InsertOrGet that reads by ref; in a
// MySQL transaction it is a locking read, as uniq's documentation asks.
func getOrder(d dialect, ref string) func(context.Context, uniq.Querier) (order, error) {
	return func(ctx context.Context, q uniq.Querier) (order, error) {
		query := `SELECT id, ref, amount FROM orders WHERE ref = ?`
		if _, tx := q.(*sql.Tx); tx && d == mysql {
			query += ` LOCK IN SHARE MODE`
		}
		var o order
		err := q.QueryRowContext(ctx, rebind(d, query), ref).Scan(&o.ID, &o.Ref, &o.Amount)
		return o, err
	}
}

// TestIsDuplicateServers provokes real constraint violations on each
// server and driver: unique index and primary key are duplicates; not
// null, check and foreign key are not. Each refused statement leaves the
// tables as they were.
func TestIsDuplicateServers(t *testing.T) {
	t.Parallel()
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db := uniqSchema(t, s)
			ctx := context.Background()
			ex := func(q string, args ...any) error {
				_, err := db.ExecContext(ctx, rebind(s.dialect, q), args...)
				return err
			}
			if err := ex(`INSERT INTO orders (ref, email, amount, customer_id) VALUES ('a', 'a@x', 1, 1)`); err != nil {
				t.Fatal(err)
			}
			if err := ex(`INSERT INTO items (sku, name) VALUES ('s1', 'one')`); err != nil {
				t.Fatal(err)
			}
			for _, tc := range []struct {
				name string
				stmt string
				dup  bool
			}{
				{"unique index", `INSERT INTO orders (ref, amount) VALUES ('a', 2)`, true},
				{"second unique index", `INSERT INTO orders (ref, email, amount) VALUES ('b', 'a@x', 2)`, true},
				{"primary key", `INSERT INTO items (sku, name) VALUES ('s1', 'again')`, true},
				{"update into a duplicate", `UPDATE items SET sku = 's1' WHERE sku = 's2'`, true},
				{"not null", `INSERT INTO orders (ref, amount) VALUES ('c', NULL)`, false},
				{"check", `INSERT INTO orders (ref, amount) VALUES ('d', -1)`, false},
				{"foreign key", `INSERT INTO orders (ref, amount, customer_id) VALUES ('e', 1, 42)`, false},
			} {
				if tc.name == "update into a duplicate" {
					if err := ex(`INSERT INTO items (sku, name) VALUES ('s2', 'two')`); err != nil {
						t.Fatal(err)
					}
				}
				err := ex(tc.stmt)
				if err == nil {
					t.Errorf("%s: %s succeeded", tc.name, tc.stmt)
					continue
				}
				if got := uniq.IsDuplicate(err); got != tc.dup {
					t.Errorf("%s: IsDuplicate(%v [%T]) = %v, want %v", tc.name, err, err, got, tc.dup)
				}
				if got := uniq.IsDuplicate(fmt.Errorf("wrapped: %w", err)); got != tc.dup {
					t.Errorf("%s: IsDuplicate(wrapped %v) = %v, want %v", tc.name, err, got, tc.dup)
				}
			}
			if n := count(t, db, s.dialect, `SELECT COUNT(*) FROM orders`); n != 1 {
				t.Errorf("%d orders, want the 1 inserted", n)
			}
			if n := count(t, db, s.dialect, `SELECT COUNT(*) FROM items`); n != 2 {
				t.Errorf("%d items, want the 2 inserted", n)
			}
		})
	}
}

// TestInsertOrGetServers runs InsertOrGet with a *sql.DB, a *sql.Conn and
// a *sql.Tx: the first call creates, the second reads the same row; a
// duplicate on another unique index is an UnresolvedError, never a
// success; in a transaction, a duplicate leaves it usable and it commits.
func TestInsertOrGetServers(t *testing.T) {
	t.Parallel()
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db := uniqSchema(t, s)
			ctx := context.Background()
			d := s.dialect

			check := func(t *testing.T, q uniq.Querier, ref string) {
				t.Helper()
				first, created, err := uniq.InsertOrGet(ctx, q, insertOrder(d, ref, "", 10), getOrder(d, ref))
				if err != nil || !created || first.ID == 0 {
					t.Fatalf("first call: %+v, created %v, %v", first, created, err)
				}
				again, created, err := uniq.InsertOrGet(ctx, q, insertOrder(d, ref, "", 99), getOrder(d, ref))
				if err != nil || created {
					t.Fatalf("second call: %+v, created %v, %v", again, created, err)
				}
				if again != first {
					t.Errorf("second call read %+v, want the first row %+v (its amount, not the second insert's)", again, first)
				}
			}

			t.Run("DB", func(t *testing.T) {
				check(t, db, "db-1")
				if n := count(t, db, d, `SELECT COUNT(*) FROM orders WHERE ref = ?`, "db-1"); n != 1 {
					t.Errorf("%d rows for db-1, want 1", n)
				}
			})
			t.Run("Conn", func(t *testing.T) {
				conn, err := db.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				check(t, conn, "conn-1")
				// Through conn: SQLite's pool has one connection.
				if n := count(t, conn, d, `SELECT COUNT(*) FROM orders WHERE ref = ?`, "conn-1"); n != 1 {
					t.Errorf("%d rows for conn-1, want 1", n)
				}
			})
			t.Run("Tx", func(t *testing.T) {
				// Committed beforehand, met as a duplicate in the transaction.
				if _, _, err := uniq.InsertOrGet(ctx, db, insertOrder(d, "tx-old", "", 5), getOrder(d, "tx-old")); err != nil {
					t.Fatal(err)
				}
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				old, created, err := uniq.InsertOrGet(ctx, tx, insertOrder(d, "tx-old", "", 6), getOrder(d, "tx-old"))
				if err != nil || created || old.Amount != 5 {
					t.Fatalf("duplicate in tx: %+v, created %v, %v", old, created, err)
				}
				// The transaction goes on after the duplicate.
				check(t, tx, "tx-1")
				if _, err := tx.ExecContext(ctx, rebind(d, `INSERT INTO items (sku, name) VALUES (?, ?)`), "after", "dup"); err != nil {
					t.Fatalf("statement after the duplicate: %v", err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatalf("commit after a duplicate: %v", err)
				}
				if n := count(t, db, d, `SELECT COUNT(*) FROM orders WHERE ref IN (?, ?)`, "tx-old", "tx-1"); n != 2 {
					t.Errorf("%d rows for tx-old and tx-1, want 2", n)
				}
				if n := count(t, db, d, `SELECT COUNT(*) FROM items WHERE sku = ?`, "after"); n != 1 {
					t.Errorf("the item inserted after the duplicate: %d rows, want 1", n)
				}
			})
			t.Run("AnotherConstraint", func(t *testing.T) {
				if _, _, err := uniq.InsertOrGet(ctx, db, insertOrder(d, "mail-1", "taken@x", 1), getOrder(d, "mail-1")); err != nil {
					t.Fatal(err)
				}
				var ue *uniq.UnresolvedError
				_, created, err := uniq.InsertOrGet(ctx, db, insertOrder(d, "mail-2", "taken@x", 1), getOrder(d, "mail-2"))
				if !errors.As(err, &ue) || created || ue.Tx || ue.Attempts != uniq.DefaultAttempts || !errors.Is(err, uniq.ErrUnresolved) || !uniq.IsDuplicate(err) {
					t.Fatalf("duplicate email under another ref on a DB: created %v, %v; want an UnresolvedError after %d attempts", created, err, uniq.DefaultAttempts)
				}
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				_, _, err = uniq.InsertOrGet(ctx, tx, insertOrder(d, "mail-3", "taken@x", 1), getOrder(d, "mail-3"))
				// At READ COMMITTED (PostgreSQL's default), or with a locking
				// get (MariaDB), get sees every committed row: a bug, not a
				// snapshot to retry.
				if !errors.As(err, &ue) || !ue.Tx || ue.Attempts != uniq.DefaultAttempts || errors.Is(err, uniq.ErrNotVisible) {
					t.Fatalf("in a tx: %v; want an UnresolvedError in a tx after %d attempts", err, uniq.DefaultAttempts)
				}
				// Still usable: the savepoint was rolled back.
				if _, _, err := uniq.InsertOrGet(ctx, tx, insertOrder(d, "mail-4", "", 1), getOrder(d, "mail-4")); err != nil {
					t.Fatalf("after an UnresolvedError in a tx: %v", err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				if n := count(t, db, d, `SELECT COUNT(*) FROM orders WHERE ref LIKE 'mail-%'`); n != 2 {
					t.Errorf("%d mail-* rows, want mail-1 and mail-4", n)
				}
			})
		})
	}
}

// TestInsertOrGetRace: 50 goroutines call InsertOrGet on one key, each on
// the pool or each in a transaction of its own: exactly one row, exactly
// one created, every caller gets that row.
func TestInsertOrGetRace(t *testing.T) {
	t.Parallel()
	const n = 50
	for _, s := range servers {
		for _, inTx := range []bool{false, true} {
			name := s.name + "/DB"
			if inTx {
				name = s.name + "/Tx"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				db := uniqSchema(t, s)
				ctx := context.Background()
				d := s.dialect
				var (
					created atomic.Int64
					ids     = make([]int64, n)
					start   = make(chan struct{})
					wg      sync.WaitGroup
				)
				for i := range n {
					wg.Go(func() {
						<-start
						insert, get := insertOrder(d, "race", "", i), getOrder(d, "race")
						var (
							o   order
							c   bool
							err error
						)
						if inTx {
							err = inTransaction(ctx, db, func(tx *sql.Tx) error {
								var err error
								o, c, err = uniq.InsertOrGet(ctx, tx, insert, get)
								return err
							})
						} else {
							o, c, err = uniq.InsertOrGet(ctx, db, insert, get)
						}
						if err != nil {
							t.Errorf("caller %d: %v", i, err)
							return
						}
						if c {
							created.Add(1)
						}
						ids[i] = o.ID
					})
				}
				close(start)
				wg.Wait()
				if got := created.Load(); got != 1 {
					t.Errorf("%d callers created the row, want 1", got)
				}
				var id int64
				if err := db.QueryRowContext(ctx, `SELECT id FROM orders WHERE ref = 'race'`).Scan(&id); err != nil {
					t.Fatal(err)
				}
				for i, got := range ids {
					if got != id {
						t.Errorf("caller %d got row %d, want %d", i, got, id)
					}
				}
				if rows := count(t, db, d, `SELECT COUNT(*) FROM orders`); rows != 1 {
					t.Errorf("%d rows, want 1", rows)
				}
			})
		}
	}
}

// inTransaction runs f in a transaction on db and commits it, or rolls it
// back when f fails.
func inTransaction(ctx context.Context, db *sql.DB, f func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// TestInsertOrGetPostgresSnapshot: in a PostgreSQL transaction at
// REPEATABLE READ or SERIALIZABLE whose snapshot predates the row the
// insert collides with, no get can see it: InsertOrGet answers
// ErrNotVisible (retry the transaction), not ErrUnresolved, the
// transaction stays usable, and the retried transaction reads the row.
// At READ COMMITTED the same collision reads the row.
func TestInsertOrGetPostgresSnapshot(t *testing.T) {
	t.Parallel()
	for _, s := range servers[:2] {
		if s.dialect != postgres {
			t.Fatalf("%s is not PostgreSQL", s.name)
		}
		for _, level := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable, sql.LevelReadCommitted} {
			t.Run(s.name+"/"+level.String(), func(t *testing.T) {
				t.Parallel()
				db := uniqSchema(t, s)
				ctx := context.Background()
				tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				if n := count(t, tx, postgres, `SELECT COUNT(*) FROM orders`); n != 0 { // takes the snapshot
					t.Fatalf("%d orders", n)
				}
				if _, err := db.ExecContext(ctx, `INSERT INTO orders (ref, amount) VALUES ('late', 7)`); err != nil {
					t.Fatal(err)
				}
				o, created, err := uniq.InsertOrGet(ctx, tx, insertOrder(postgres, "late", "", 8), getOrder(postgres, "late"))
				if level == sql.LevelReadCommitted {
					if err != nil || created || o.Amount != 7 {
						t.Fatalf("READ COMMITTED: %+v, created %v, %v; want the committed row", o, created, err)
					}
					return
				}
				var nv *uniq.NotVisibleError
				if !errors.As(err, &nv) || !errors.Is(err, uniq.ErrNotVisible) || errors.Is(err, uniq.ErrUnresolved) || !uniq.IsDuplicate(err) || created {
					t.Fatalf("old snapshot: created %v, %v; want a NotVisibleError", created, err)
				}
				if want := map[sql.IsolationLevel]string{sql.LevelRepeatableRead: "repeatable read", sql.LevelSerializable: "serializable"}[level]; nv.Isolation != want {
					t.Errorf("Isolation %q, want %q", nv.Isolation, want)
				}
				if n := count(t, tx, postgres, `SELECT COUNT(*) FROM orders`); n != 0 {
					t.Fatalf("the transaction after ErrNotVisible: %d orders", n)
				}
				if err := tx.Rollback(); err != nil {
					t.Fatal(err)
				}
				// The retry, on a new snapshot, reads the row.
				retry, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
				if err != nil {
					t.Fatal(err)
				}
				defer retry.Rollback()
				o, created, err = uniq.InsertOrGet(ctx, retry, insertOrder(postgres, "late", "", 8), getOrder(postgres, "late"))
				if err != nil || created || o.Amount != 7 {
					t.Fatalf("retried transaction: %+v, created %v, %v; want the committed row", o, created, err)
				}
				if n := count(t, db, postgres, `SELECT COUNT(*) FROM orders WHERE ref = 'late'`); n != 1 {
					t.Errorf("%d rows for late, want 1", n)
				}
			})
		}
	}
}

// TestInsertOrGetMySQLSnapshot: in a MariaDB transaction under REPEATABLE
// READ (the default) whose snapshot predates the row, a plain get cannot
// see the row that the insert collides with — an UnresolvedError (get
// must use a locking read there: a bug, never a success) — and a locking get (LOCK IN SHARE MODE) reads it.
func TestInsertOrGetMySQLSnapshot(t *testing.T) {
	t.Parallel()
	s := servers[2]
	if s.dialect != mysql {
		t.Fatalf("servers[2] is %s", s.name)
	}
	db := uniqSchema(t, s)
	ctx := context.Background()
	plainGet := func(ctx context.Context, q uniq.Querier) (order, error) {
		var o order
		err := q.QueryRowContext(ctx, `SELECT id, ref, amount FROM orders WHERE ref = 'late'`).Scan(&o.ID, &o.Ref, &o.Amount)
		return o, err
	}
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if n := count(t, tx, mysql, `SELECT COUNT(*) FROM orders`); n != 0 { // takes the snapshot
		t.Fatalf("%d orders", n)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO orders (ref, amount) VALUES ('late', 7)`); err != nil {
		t.Fatal(err)
	}
	_, _, err = uniq.InsertOrGet(ctx, tx, insertOrder(mysql, "late", "", 8), plainGet)
	if !errors.Is(err, uniq.ErrUnresolved) {
		t.Fatalf("plain get on an old snapshot: %v, want ErrUnresolved", err)
	}
	o, created, err := uniq.InsertOrGet(ctx, tx, insertOrder(mysql, "late", "", 8), getOrder(mysql, "late"))
	if err != nil || created || o.Amount != 7 {
		t.Fatalf("locking get: %+v, created %v, %v; want the committed row", o, created, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}
