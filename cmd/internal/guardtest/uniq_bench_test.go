package guardtest_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/benchpair"
	"github.com/idemkit/idem/uniq"
)

// BenchmarkInsertOrGet measures InsertOrGet on a new key (one INSERT …
// RETURNING) and on an existing key (the refused INSERT, then the SELECT)
// against the bare statements, in one interleaved loop (benchpair): the
// bare INSERT of a new key and the bare SELECT by the unique key.
//
//	go test -run '^$' -bench InsertOrGet -benchmem ./internal/guardtest/
func BenchmarkInsertOrGet(b *testing.B) {
	for _, s := range []server{servers[0], servers[3]} { // PostgreSQL (pgx), SQLite
		b.Run(s.name, func(b *testing.B) {
			db := uniqSchema(b, s)
			ctx := context.Background()
			d := s.dialect
			if _, _, err := uniq.InsertOrGet(ctx, db, insertOrder(d, "existing", "", 1), getOrder(d, "existing")); err != nil {
				b.Fatal(err)
			}
			n := 0
			key := func() string { n++; return "k" + strconv.Itoa(n) }
			var ref string
			newRef := func() { ref = key() }
			means := benchpair.Run(b,
				benchpair.Func{Name: "bare-insert", Before: newRef, F: func() {
					if _, err := insertOrder(d, ref, "", 1)(ctx, db); err != nil {
						b.Fatal(err)
					}
				}},
				benchpair.Func{Name: "bare-select", F: func() {
					if _, err := getOrder(d, "existing")(ctx, db); err != nil {
						b.Fatal(err)
					}
				}},
				benchpair.Func{Name: "new", Before: newRef, F: func() {
					if _, created, err := uniq.InsertOrGet(ctx, db, insertOrder(d, ref, "", 1), getOrder(d, ref)); err != nil || !created {
						b.Fatal(created, err)
					}
				}},
				benchpair.Func{Name: "existing", F: func() {
					if _, created, err := uniq.InsertOrGet(ctx, db, insertOrder(d, "existing", "", 1), getOrder(d, "existing")); err != nil || created {
						b.Fatal(created, err)
					}
				}},
			)
			benchpair.Ratio(b, "new-x-insert", means[2], means[0])
			benchpair.Ratio(b, "existing-x-insert", means[3], means[0])
			benchpair.Ratio(b, "existing-x-insert+select", means[3], means[0]+means[1])
		})
	}
}

// BenchmarkInsertBatch measures InsertBatch importing 5000 new products
// (statements of 1000 rows) into a fresh table against the same
// multi-row INSERT statements without the guard, in one interleaved loop
// (benchpair); each call gets a table of its own, created before it and
// not timed. "rerun" imports the same 5000 rows again into a table that
// holds them all (every row already there).
//
//	go test -run '^$' -bench InsertBatch -benchmem ./internal/guardtest/
func BenchmarkInsertBatch(b *testing.B) {
	const rows, size = 5000, 1000
	input := make([][]any, rows)
	for i := range input {
		input[i] = product(fmt.Sprintf("SKU-%06d", i), i)
	}
	for _, s := range []server{servers[0], servers[2], servers[3]} { // PostgreSQL (pgx), MariaDB, SQLite
		b.Run(s.name, func(b *testing.B) {
			db := s.open(b)
			ctx := context.Background()
			d := s.dialect
			tables := 0
			var table string
			fresh := func() {
				if table != "" {
					execAll(b, db, `DROP TABLE `+table)
				}
				tables++
				table = "bench_" + strconv.Itoa(tables)
				createProducts(b, db, d, table, "")
			}
			// The plain import: the same statements, no guard.
			plain := func() {
				for start := 0; start < rows; start += size {
					var sb strings.Builder
					args := make([]any, 0, size*3)
					sb.WriteString(`INSERT INTO ` + table + ` (sku, name, price) VALUES `)
					for i, r := range input[start : start+size] {
						if i > 0 {
							sb.WriteString(", ")
						}
						sb.WriteString("(?, ?, ?)")
						args = append(args, r...)
					}
					if _, err := db.ExecContext(ctx, rebind(d, sb.String()), args...); err != nil {
						b.Fatal(err)
					}
				}
			}
			guard := func(want uniq.Outcome) {
				got, err := uniq.InsertBatch(ctx, db, productSpec(d, table, size), input)
				if err != nil {
					b.Fatal(err)
				}
				if n := countOutcome(got, want); n != rows {
					b.Fatalf("%d rows %v, want %d", n, want, rows)
				}
			}
			means := benchpair.Run(b,
				benchpair.Func{Name: "plain", Before: fresh, F: plain},
				benchpair.Func{Name: "guard", Before: fresh, F: func() { guard(uniq.Created) }},
				benchpair.Func{Name: "rerun", Before: func() { fresh(); plain() }, F: func() { guard(uniq.Existing) }},
			)
			// Throughput ratio: guard rows/s over plain rows/s.
			benchpair.Ratio(b, "guard-throughput-x-plain", means[0], means[1])
			benchpair.Ratio(b, "rerun-x-plain", means[2], means[0])
		})
	}
}
