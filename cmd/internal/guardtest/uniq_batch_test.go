package guardtest_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"

	"github.com/idemkit/idem/uniq"
)

// batchSchema creates the table of the InsertBatch tests: products, keyed
// by a unique sku, with a unique email-like ean, a NOT NULL name and a
// check on the price.
func batchSchema(t testing.TB, s server, table string) *sql.DB {
	t.Helper()
	db := s.open(t)
	createProducts(t, db, s.dialect, table, "")
	return db
}

// createProducts creates table with a unique sku (of collation coll when
// not empty), a unique ean, a NOT NULL name and a checked price.
func createProducts(t testing.TB, db *sql.DB, d dialect, table, coll string) {
	t.Helper()
	id := map[dialect]string{
		postgres: "BIGSERIAL PRIMARY KEY",
		mysql:    "BIGINT AUTO_INCREMENT PRIMARY KEY",
		sqlite3:  "INTEGER PRIMARY KEY AUTOINCREMENT",
	}[d]
	sku := "VARCHAR(64) NOT NULL"
	if coll != "" {
		sku += " COLLATE " + coll
	}
	execAll(t, db,
		`CREATE TABLE `+table+` (
			id `+id+`,
			sku `+sku+`,
			ean VARCHAR(32),
			name VARCHAR(64) NOT NULL,
			price INT NOT NULL CHECK (price >= 0)
		)`,
		`CREATE UNIQUE INDEX `+table+`_sku ON `+table+` (sku)`,
		`CREATE UNIQUE INDEX `+table+`_ean ON `+table+` (ean)`,
	)
}

// productSpec is the BatchSpec of the products table.
func productSpec(d dialect, table string, size int) uniq.BatchSpec {
	return uniq.BatchSpec{Dialect: d, Table: table, Columns: []string{"sku", "name", "price"}, Key: "sku", Size: size}
}

// product is one row of the input.
func product(sku string, price int) []any { return []any{sku, "name of " + sku, price} }

// skus returns the table's skus with how many rows each has.
func skus(t testing.TB, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, table string) map[string]int {
	t.Helper()
	rs, err := q.QueryContext(context.Background(), `SELECT sku FROM `+table)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	m := map[string]int{}
	for rs.Next() {
		var s string
		if err := rs.Scan(&s); err != nil {
			t.Fatal(err)
		}
		m[s]++
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

// outcomes renders outcomes as a string of c (created), e (already
// there) and - (not written).
func outcomes(o []uniq.Outcome) string {
	b := make([]byte, len(o))
	for i, x := range o {
		b[i] = map[uniq.Outcome]byte{uniq.NotWritten: '-', uniq.Created: 'c', uniq.Existing: 'e'}[x]
	}
	return string(b)
}

// TestInsertBatchServers: on each server and with a *sql.DB, a *sql.Conn
// and a *sql.Tx, a first import creates every row once (a second copy of
// a key in the input is "already there" and its values are not written),
// a second overlapping import creates only the new keys; a transaction
// rolled back leaves nothing, one committed leaves its rows.
func TestInsertBatchServers(t *testing.T) {
	t.Parallel()
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db := batchSchema(t, s, "products")
			ctx := context.Background()
			spec := productSpec(s.dialect, "products", 2) // statements of 2 rows: copies span statements

			run := func(t *testing.T, q uniq.Querier, p string) {
				t.Helper()
				first := [][]any{product(p+"a", 1), product(p+"b", 2), product(p+"a", 99), product(p+"c", 3), product(p+"b", 98)}
				got, err := uniq.InsertBatch(ctx, q, spec, first)
				if err != nil || outcomes(got) != "ccece" {
					t.Fatalf("first import: %s, %v; want ccece", outcomes(got), err)
				}
				second := [][]any{product(p+"c", 50), product(p+"d", 4), product(p+"a", 51), product(p+"e", 5)}
				got, err = uniq.InsertBatch(ctx, q, spec, second)
				if err != nil || outcomes(got) != "ecec" {
					t.Fatalf("second import: %s, %v; want ecec", outcomes(got), err)
				}
				var sum int
				if err := q.QueryRowContext(ctx, rebind(s.dialect, `SELECT SUM(price) FROM products WHERE sku LIKE ?`), p+"%").Scan(&sum); err != nil {
					t.Fatal(err)
				}
				if sum != 1+2+3+4+5 {
					t.Errorf("prices sum to %d, want 15: only the first copy of each key is written", sum)
				}
			}
			check := func(t *testing.T, p string, want int) {
				t.Helper()
				n := count(t, db, s.dialect, `SELECT COUNT(*) FROM products WHERE sku LIKE ?`, p+"%")
				if n != want {
					t.Errorf("%d rows with prefix %s, want %d", n, p, want)
				}
			}

			t.Run("DB", func(t *testing.T) {
				run(t, db, "db-")
				check(t, "db-", 5)
			})
			t.Run("Conn", func(t *testing.T) {
				conn, err := db.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				run(t, conn, "conn-")
				conn.Close()
				check(t, "conn-", 5)
			})
			t.Run("Tx", func(t *testing.T) {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				run(t, tx, "rollback-")
				if err := tx.Rollback(); err != nil {
					t.Fatal(err)
				}
				check(t, "rollback-", 0)
				if tx, err = db.BeginTx(ctx, nil); err != nil {
					t.Fatal(err)
				}
				run(t, tx, "commit-")
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				check(t, "commit-", 5)
			})
		})
	}
}

// TestInsertBatchErrors: errors other than a duplicate of the key are
// errors, never skipped rows: a NOT NULL or check violation, and a
// collision on another unique index. The statements written before keep
// their rows and outcomes; the failing one and those after it write
// nothing.
func TestInsertBatchErrors(t *testing.T) {
	t.Parallel()
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db := batchSchema(t, s, "products")
			ctx := context.Background()
			spec := productSpec(s.dialect, "products", 2)
			for _, tc := range []struct {
				name string
				bad  []any
			}{
				{"not null", []any{"nn-x", nil, 1}},
				{"check", []any{"ck-x", "negative", -1}},
			} {
				p := tc.name[:2] + "-"
				rows := [][]any{product(p+"1", 1), product(p+"2", 2), product(p+"3", 3), tc.bad, product(p+"5", 5)}
				got, err := uniq.InsertBatch(ctx, db, spec, rows)
				if err == nil || uniq.IsDuplicate(err) {
					t.Errorf("%s: err = %v, want the violation", tc.name, err)
				}
				if outcomes(got) != "cc---" {
					t.Errorf("%s: outcomes %s, want cc---", tc.name, outcomes(got))
				}
				if m := skus(t, db, "products"); m[p+"1"] != 1 || m[p+"2"] != 1 || m[p+"3"] != 0 || m[p+"5"] != 0 {
					t.Errorf("%s: rows %v, want only %s1 and %s2", tc.name, m, p, p)
				}
			}

			// Another unique index (ean): the row is not "already there".
			ean := uniq.BatchSpec{Dialect: s.dialect, Table: "products", Columns: []string{"sku", "ean", "name", "price"}, Key: "sku"}
			if _, err := uniq.InsertBatch(ctx, db, ean, [][]any{{"ean-1", "4006381333931", "x", 1}}); err != nil {
				t.Fatal(err)
			}
			got, err := uniq.InsertBatch(ctx, db, ean, [][]any{{"ean-2", "4006381333931", "y", 1}})
			if err == nil {
				t.Errorf("a collision on the ean index answered %s, want an error", outcomes(got))
			}
			if s.dialect == mysql && !errors.Is(err, uniq.ErrUnresolved) {
				t.Errorf("MySQL: err = %v, want ErrUnresolved", err)
			}
			if n := count(t, db, s.dialect, `SELECT COUNT(*) FROM products WHERE sku = 'ean-2'`); n != 0 {
				t.Errorf("%d rows ean-2, want 0", n)
			}

			// Bad input is refused before anything is written.
			if _, err := uniq.InsertBatch(ctx, db, spec, [][]any{product("bad-1", 1), {"bad-2", "short"}}); err == nil {
				t.Error("a short row was accepted")
			}
			if _, err := uniq.InsertBatch(ctx, db, spec, [][]any{product("bad-3", 1), {nil, "null key", 1}}); err == nil {
				t.Error("a NULL key was accepted")
			}
			if n := count(t, db, s.dialect, `SELECT COUNT(*) FROM products WHERE sku LIKE 'bad-%'`); n != 0 {
				t.Errorf("%d rows written by refused input, want 0", n)
			}
		})
	}
}

// TestInsertIgnoreSwallows shows why MySQL's InsertBatch does not use
// INSERT IGNORE: it turns a NOT NULL violation into a warning and writes a
// row with an empty name, and skips a foreign-key violation without an
// error, where InsertBatch answers both with the error.
func TestInsertIgnoreSwallows(t *testing.T) {
	t.Parallel()
	s := servers[2]
	if s.dialect != mysql {
		t.Fatal("servers[2] is not MariaDB")
	}
	db := batchSchema(t, s, "products")
	ctx := context.Background()
	execAll(t, db,
		`CREATE TABLE makers (id BIGINT PRIMARY KEY)`,
		`CREATE TABLE parts (sku VARCHAR(64) PRIMARY KEY, maker BIGINT NOT NULL, FOREIGN KEY (maker) REFERENCES makers (id))`)
	if _, err := db.ExecContext(ctx, `INSERT IGNORE INTO products (sku, name, price) VALUES ('ig-1', NULL, 1)`); err != nil {
		t.Fatalf("INSERT IGNORE with a NULL name: %v (the server no longer swallows it)", err)
	}
	var name string
	if err := db.QueryRowContext(ctx, `SELECT name FROM products WHERE sku = 'ig-1'`).Scan(&name); err != nil || name != "" {
		t.Fatalf("INSERT IGNORE wrote name %q, %v; want the empty string it substitutes", name, err)
	}
	res, err := db.ExecContext(ctx, `INSERT IGNORE INTO parts (sku, maker) VALUES ('p-1', 42)`)
	if err != nil {
		t.Fatalf("INSERT IGNORE with a missing maker: %v", err)
	}
	if n, _ := res.RowsAffected(); n != 0 {
		t.Fatalf("INSERT IGNORE with a missing maker affected %d rows", n)
	}

	spec := productSpec(mysql, "products", 0)
	if _, err := uniq.InsertBatch(ctx, db, spec, [][]any{{"ig-2", nil, 1}}); err == nil {
		t.Error("InsertBatch with a NULL name succeeded")
	}
	parts := uniq.BatchSpec{Dialect: mysql, Table: "parts", Columns: []string{"sku", "maker"}, Key: "sku"}
	if _, err := uniq.InsertBatch(ctx, db, parts, [][]any{{"p-2", 42}}); err == nil {
		t.Error("InsertBatch with a missing maker succeeded")
	}
	if n := count(t, db, mysql, `SELECT COUNT(*) FROM products WHERE sku = 'ig-2'`) + count(t, db, mysql, `SELECT COUNT(*) FROM parts`); n != 0 {
		t.Errorf("%d rows written by InsertBatch's refused input, want 0", n)
	}
}

// TestInsertBatchCollation: keys that only the column's collation makes
// equal ('SKU-1' and 'sku-1' in a case-insensitive column) are one key:
// the second is "already there", in one input and across inputs, and the
// table holds one row.
func TestInsertBatchCollation(t *testing.T) {
	t.Parallel()
	coll := map[dialect]string{mysql: "utf8mb4_general_ci", sqlite3: "NOCASE"}
	for _, s := range servers {
		if coll[s.dialect] == "" {
			continue // PostgreSQL's text compares bytes (citext is an extension)
		}
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db := s.open(t)
			createProducts(t, db, s.dialect, "products", coll[s.dialect])
			ctx := context.Background()
			spec := productSpec(s.dialect, "products", 0)
			got, err := uniq.InsertBatch(ctx, db, spec, [][]any{product("SKU-1", 1), product("sku-1", 2), product("SKU-2", 3)})
			if err != nil || outcomes(got) != "cec" {
				t.Fatalf("first import: %s, %v; want cec", outcomes(got), err)
			}
			got, err = uniq.InsertBatch(ctx, db, spec, [][]any{product("Sku-2", 4), product("SKU-3", 5), product("sKu-1", 6)})
			if err != nil || outcomes(got) != "ece" {
				t.Fatalf("second import: %s, %v; want ece", outcomes(got), err)
			}
			if m := skus(t, db, "products"); len(m) != 3 || m["SKU-1"] != 1 || m["SKU-2"] != 1 || m["SKU-3"] != 1 {
				t.Errorf("rows %v, want SKU-1, SKU-2 and SKU-3 once each", m)
			}
		})
	}
}

// TestInsertBatchPlaceholderLimit: an input whose parameters exceed the
// database's limit (65535 on PostgreSQL and MySQL, 32766 on SQLite) in
// one statement is split: Size is lowered to fit, and every row is
// written.
func TestInsertBatchPlaceholderLimit(t *testing.T) {
	t.Parallel()
	for _, s := range servers {
		if s.name == "PostgreSQL-libpq" {
			continue
		}
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db := batchSchema(t, s, "products")
			const n = 25000 // 75000 parameters
			rows := make([][]any, n)
			for i := range rows {
				rows[i] = product("big-"+strconv.Itoa(i), i)
			}
			got, err := uniq.InsertBatch(context.Background(), db, productSpec(s.dialect, "products", n), rows)
			if err != nil {
				t.Fatal(err)
			}
			if c := countOutcome(got, uniq.Created); c != n {
				t.Errorf("%d created, want %d", c, n)
			}
			if c := count(t, db, s.dialect, `SELECT COUNT(*) FROM products`); c != n {
				t.Errorf("%d rows, want %d", c, n)
			}
		})
	}
}

func countOutcome(o []uniq.Outcome, want uniq.Outcome) int {
	n := 0
	for _, x := range o {
		if x == want {
			n++
		}
	}
	return n
}

// TestInsertBatchConcurrent: many goroutines import overlapping ranges of
// keys, each in its own order and in statements of a few rows, at once.
// Every key is in the table once, and exactly one call reported it
// created; the sum of the created reports is the number of keys.
func TestInsertBatchConcurrent(t *testing.T) {
	t.Parallel()
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db := batchSchema(t, s, "products")
			ctx := context.Background()
			const (
				workers = 12
				span    = 300 // keys per worker; worker w imports [w*100, w*100+span)
				step    = 100
			)
			var mu sync.Mutex
			created := map[string]int{}
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Go(func() {
					rows := make([][]any, 0, span)
					for k := w * step; k < w*step+span; k++ {
						rows = append(rows, product(fmt.Sprintf("k%05d", k), k))
					}
					r := rand.New(rand.NewPCG(uint64(w), 7))
					r.Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
					got, err := uniq.InsertBatch(ctx, db, productSpec(s.dialect, "products", 7+w), rows)
					if err != nil {
						errs <- fmt.Errorf("worker %d: %w", w, err)
						return
					}
					mu.Lock()
					defer mu.Unlock()
					for i, o := range got {
						switch o {
						case uniq.Created:
							created[rows[i][0].(string)]++
						case uniq.Existing:
						default:
							errs <- fmt.Errorf("worker %d: rows[%d] %v", w, i, o)
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			keys := (workers-1)*step + span
			sum := 0
			for k, n := range created {
				sum += n
				if n != 1 {
					t.Errorf("%s reported created %d times", k, n)
				}
			}
			if sum != keys || len(created) != keys {
				t.Errorf("%d created reports for %d distinct keys, want %d", sum, len(created), keys)
			}
			m := skus(t, db, "products")
			if len(m) != keys {
				t.Errorf("%d keys in the table, want %d", len(m), keys)
			}
			for k, n := range m {
				if n != 1 {
					t.Errorf("%s has %d rows", k, n)
				}
			}
		})
	}
}

// cancelAfter is a Querier that lets calls statements run and cancels
// the import's context when the next one starts: a crash half way through
// a call of InsertBatch, at a point that does not depend on timing.
type cancelAfter struct {
	uniq.Querier
	calls  int
	cancel context.CancelFunc
}

func (c *cancelAfter) tick() {
	if c.calls == 0 {
		c.cancel()
		return
	}
	c.calls--
}

func (c *cancelAfter) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	c.tick()
	return c.Querier.ExecContext(ctx, q, args...)
}

func (c *cancelAfter) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	c.tick()
	return c.Querier.QueryContext(ctx, q, args...)
}

// TestInsertBatchCrashHalfWay imports a CSV of 5000 products in calls of
// 1000 rows, written in statements of 250, and stops the first run in the
// middle of its third call (its context cancelled after a number of
// statements). Running the whole import again leaves every row in the
// table exactly once; the second run reports the first run's rows (and
// only them) as already there and creates the rest.
func TestInsertBatchCrashHalfWay(t *testing.T) {
	t.Parallel()
	const n = 5000
	var file bytes.Buffer
	w := csv.NewWriter(&file)
	_ = w.Write([]string{"sku", "name", "price"})
	for i := range n {
		_ = w.Write([]string{fmt.Sprintf("CSV-%06d", i), "product " + strconv.Itoa(i), strconv.Itoa(i % 977)})
	}
	w.Flush()

	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db := batchSchema(t, s, "products")
			spec := productSpec(s.dialect, "products", 250)

			// importCSV imports the file in calls of 1000 rows and returns
			// each row's outcome, by sku.
			importCSV := func(ctx context.Context, q uniq.Querier) (map[string]uniq.Outcome, error) {
				r := csv.NewReader(bytes.NewReader(file.Bytes()))
				if _, err := r.Read(); err != nil {
					return nil, err
				}
				out := map[string]uniq.Outcome{}
				var rows [][]any
				flush := func() error {
					got, err := uniq.InsertBatch(ctx, q, spec, rows)
					for i, o := range got {
						out[rows[i][0].(string)] = o
					}
					rows = rows[:0]
					return err
				}
				for {
					rec, err := r.Read()
					if err == io.EOF {
						break
					}
					if err != nil {
						return out, err
					}
					price, err := strconv.Atoi(rec[2])
					if err != nil {
						return out, err
					}
					if rows = append(rows, []any{rec[0], rec[1], price}); len(rows) == 1000 {
						if err := flush(); err != nil {
							return out, err
						}
					}
				}
				if len(rows) > 0 {
					return out, flush()
				}
				return out, nil
			}

			// First run, on an empty table: 4 statements per call (no
			// transaction: cancelAfter cannot begin one); stop after 2½
			// calls.
			const perCall = 4
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			first, err := importCSV(ctx, &cancelAfter{Querier: db, calls: 2*perCall + perCall/2, cancel: cancel})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("first run: %v, want context.Canceled", err)
			}
			done := 0
			for _, o := range first {
				switch o {
				case uniq.Created:
					done++
				case uniq.NotWritten:
				default:
					t.Errorf("first run: %v on an empty table", o)
				}
			}
			if done != 2500 {
				t.Errorf("first run created %d rows, want 2500 (2½ calls)", done)
			}
			if c := count(t, db, s.dialect, `SELECT COUNT(*) FROM products`); c != done {
				t.Errorf("%d rows after the first run, want the %d it reported", c, done)
			}

			second, err := importCSV(context.Background(), db)
			if err != nil {
				t.Fatalf("second run: %v", err)
			}
			var existing, created int
			for sku, o := range second {
				switch {
				case o == uniq.Existing && first[sku] == uniq.Created:
					existing++
				case o == uniq.Created && first[sku] != uniq.Created:
					created++
				default:
					t.Errorf("%s: first run %v, second run %v", sku, first[sku], o)
				}
			}
			if existing != done || created != n-done {
				t.Errorf("second run: %d already there, %d created; want %d and %d", existing, created, done, n-done)
			}
			m := skus(t, db, "products")
			if len(m) != n {
				t.Errorf("%d rows, want %d", len(m), n)
			}
			for sku, c := range m {
				if c != 1 {
					t.Errorf("%s has %d rows", sku, c)
				}
			}
			var sum int
			if err := db.QueryRow(`SELECT SUM(price) FROM products`).Scan(&sum); err != nil {
				t.Fatal(err)
			}
			want := 0
			for i := range n {
				want += i % 977
			}
			if sum != want {
				t.Errorf("prices sum to %d, want %d", sum, want)
			}
		})
	}
}
