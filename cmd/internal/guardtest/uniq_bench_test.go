package guardtest_test

import (
	"context"
	"strconv"
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
