package guardtest_test

import (
	"context"
	"encoding/csv"
	"fmt"
	"strconv"
	"strings"

	"github.com/idemkit/idem/sqldialect"
	"github.com/idemkit/idem/uniq"
)

// A catalogue import that crashed half way is run again: the products it
// wrote are already there, the others are created, and each is in the
// table once.
func Example_uniqInsertBatch() {
	db, cleanup := exampleDB()
	defer cleanup()
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE products (sku TEXT PRIMARY KEY, name TEXT NOT NULL, price_cents INTEGER NOT NULL)`); err != nil {
		panic(err)
	}
	spec := uniq.BatchSpec{
		Dialect: sqldialect.SQLite,
		Table:   "products",
		Columns: []string{"sku", "name", "price_cents"},
		Key:     "sku",
	}
	const file = `SKU-1,Notebook,1299
BOOK-1,Book,2500
SKU-1,Notebook (again),1399
PEN-1,Pen,199
`
	recs, err := csv.NewReader(strings.NewReader(file)).ReadAll()
	if err != nil {
		panic(err)
	}
	rows := make([][]any, len(recs))
	for i, r := range recs {
		cents, err := strconv.Atoi(r[2])
		if err != nil {
			panic(err)
		}
		rows[i] = []any{r[0], r[1], cents}
	}

	// The first run wrote the first two lines, then stopped.
	if _, err := uniq.InsertBatch(ctx, db, spec, rows[:2]); err != nil {
		panic(err)
	}
	// The whole file again.
	outcomes, err := uniq.InsertBatch(ctx, db, spec, rows)
	if err != nil {
		panic(err)
	}
	for i, o := range outcomes {
		fmt.Println(recs[i][0], o)
	}
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM products`).Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println(n, "products")
	// Output:
	// SKU-1 already there
	// BOOK-1 already there
	// SKU-1 already there
	// PEN-1 created
	// 3 products
}
