package shop_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/sqlstore"
)

// A catalogue file that is not a valid catalogue is refused with a message
// that names the file and what is wrong, where it is.
func TestReadCatalogRefuses(t *testing.T) {
	t.Parallel()
	product := `{"sku": "SKU-1", "name": "Notebook", "price_cents": 1299, "stock": 100}`
	for _, c := range []struct {
		name, body string
		want       []string // substrings of the error
	}{
		{"empty file", ``, []string{"EOF"}},
		{"not json", `products: []`, []string{"invalid character"}},
		{"array", `[` + product + `]`, []string{"cannot unmarshal array"}},
		{"unknown member", `{"products": [` + product + `], "discounts": []}`, []string{`unknown field "discounts"`}},
		{"unknown product member", `{"products": [{"sku": "A", "name": "A", "price_cents": 1, "stock": 1, "colour": "red"}]}`, []string{`unknown field "colour"`}},
		{"two objects", `{"products": [` + product + `]} {}`, []string{"data after the catalogue object"}},
		{"no products", `{"products": []}`, []string{"no products"}},
		{"price not an integer", `{"products": [{"sku": "A", "name": "A", "price_cents": 12.5, "stock": 1}]}`, []string{"price_cents"}},
		{"price a string", `{"products": [{"sku": "A", "name": "A", "price_cents": "12", "stock": 1}]}`, []string{"price_cents"}},
		{"bad sku", `{"products": [{"sku": "a b", "name": "A", "price_cents": 1, "stock": 1}]}`, []string{"products[0]", `sku "a b"`}},
		{"empty sku", `{"products": [{"sku": "", "name": "A", "price_cents": 1, "stock": 1}]}`, []string{"products[0]", "sku"}},
		{"long sku", `{"products": [{"sku": "` + strings.Repeat("A", 65) + `", "name": "A", "price_cents": 1, "stock": 1}]}`, []string{"products[0]", "1 to 64"}},
		{"sku twice", `{"products": [` + product + `, ` + product + `]}`, []string{"products[1]", `"SKU-1" appears twice`}},
		{"no name", `{"products": [{"sku": "A", "price_cents": 1, "stock": 1}]}`, []string{"products[0] (A)", "name"}},
		{"negative price", `{"products": [{"sku": "A", "name": "A", "price_cents": -1, "stock": 1}]}`, []string{"products[0] (A)", "price_cents"}},
		{"huge price", `{"products": [{"sku": "A", "name": "A", "price_cents": 100000000001, "stock": 1}]}`, []string{"products[0] (A)", "price_cents"}},
		{"negative stock", `{"products": [{"sku": "A", "name": "A", "price_cents": 1, "stock": -1}]}`, []string{"products[0] (A)", "stock"}},
		{"huge stock", `{"products": [{"sku": "A", "name": "A", "price_cents": 1, "stock": 1000000001}]}`, []string{"products[0] (A)", "stock"}},
		{"coupon id zero", `{"products": [` + product + `], "coupons": [{"id": 0, "name": "c", "discount_cents": 1, "total": 1}]}`, []string{"coupons[0]", "id"}},
		{"coupon id twice", `{"products": [` + product + `], "coupons": [{"id": 1, "name": "c", "discount_cents": 1, "total": 1}, {"id": 1, "name": "d", "discount_cents": 1, "total": 1}]}`, []string{"coupons[1]", "id 1 appears twice"}},
		{"coupon no name", `{"products": [` + product + `], "coupons": [{"id": 1, "discount_cents": 1, "total": 1}]}`, []string{"coupons[0] (1)", "name"}},
		{"coupon no discount", `{"products": [` + product + `], "coupons": [{"id": 1, "name": "c", "discount_cents": 0, "total": 1}]}`, []string{"coupons[0] (1)", "discount_cents"}},
		{"coupon negative total", `{"products": [` + product + `], "coupons": [{"id": 1, "name": "c", "discount_cents": 1, "total": -1}]}`, []string{"coupons[0] (1)", "total"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "catalog.json")
			if err := os.WriteFile(path, []byte(c.body), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := shop.ReadCatalog(path)
			if err == nil {
				t.Fatalf("ReadCatalog accepted %s", c.body)
			}
			for _, want := range append([]string{"-catalog " + path}, c.want...) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
	if _, err := shop.ReadCatalog(filepath.Join(t.TempDir(), "missing.json")); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "-catalog") {
		t.Errorf("missing file: %v, want a -catalog error wrapping os.ErrNotExist", err)
	}
}

// writeCatalog writes c as a catalogue file and returns its path.
func writeCatalog(t *testing.T, c shop.Catalog) string {
	t.Helper()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "catalog.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReadCatalogReadsWhatItWrote(t *testing.T) {
	t.Parallel()
	want := shop.Catalog{
		Products: []shop.Product{{SKU: "TEA-1", Name: "Tea", PriceCents: 450, Stock: 7}, {SKU: "FREE", Name: "Sticker", PriceCents: 0, Stock: 0}},
		Coupons:  []shop.Coupon{{ID: 9, Name: "1 off", DiscountCents: 100, Total: 0}},
	}
	got, err := shop.ReadCatalog(writeCatalog(t, want))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("read %+v, want %+v", got, want)
	}
	if err := shop.DefaultCatalog().Validate(); err != nil {
		t.Fatalf("the default catalogue is invalid: %v", err)
	}
}

// migrated returns a fresh database of b with the shop's tables and the
// idempotency store's, not seeded.
func migrated(t *testing.T, b backend) (*sql.DB, string) {
	t.Helper()
	ctx := context.Background()
	db, arg := b.fresh(t)
	store, err := sqlstore.New(db, &sqlstore.Config{Dialect: b.dialect})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := shop.Migrate(ctx, db, b.dialect); err != nil {
		t.Fatal(err)
	}
	return db, arg
}

// catalogRows reads the products and coupons a database holds, and how
// many catalogue digests shop_meta records.
func catalogRows(t *testing.T, db *sql.DB) (shop.Catalog, int) {
	t.Helper()
	var c shop.Catalog
	rows, err := db.Query(`SELECT sku, name, price_cents, stock FROM shop_products ORDER BY sku`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var p shop.Product
		if err := rows.Scan(&p.SKU, &p.Name, &p.PriceCents, &p.Stock); err != nil {
			t.Fatal(err)
		}
		c.Products = append(c.Products, p)
	}
	rows.Close()
	rows, err = db.Query(`SELECT id, name, discount_cents, total FROM shop_coupons ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var cp shop.Coupon
		if err := rows.Scan(&cp.ID, &cp.Name, &cp.DiscountCents, &cp.Total); err != nil {
			t.Fatal(err)
		}
		c.Coupons = append(c.Coupons, cp)
	}
	rows.Close()
	var metas int
	if err := db.QueryRow(`SELECT COUNT(*) FROM shop_meta`).Scan(&metas); err != nil {
		t.Fatal(err)
	}
	return c, metas
}

// sortedCatalog is c with its products in SKU order, as catalogRows reads
// them.
func sortedCatalog(c shop.Catalog) shop.Catalog {
	ps := append([]shop.Product(nil), c.Products...)
	for i := range ps {
		for j := i + 1; j < len(ps); j++ {
			if ps[j].SKU < ps[i].SKU {
				ps[i], ps[j] = ps[j], ps[i]
			}
		}
	}
	return shop.Catalog{Products: ps, Coupons: c.Coupons}
}

// Many callers seeding one fresh database at once seed it once: every
// call succeeds, the database holds the catalogue's rows once (no
// duplicate, no doubled stock), seeding again changes nothing, and another
// catalogue is refused with ErrCatalogMismatch and leaves the rows alone.
func TestSeedOnceConcurrently(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		db, _ := migrated(t, b)
		c := shop.DefaultCatalog()
		const n = 8
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				errs[i] = shop.Seed(ctx, db, b.dialect, c)
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("seeder %d: %v", i, err)
			}
		}
		got, metas := catalogRows(t, db)
		if want := sortedCatalog(c); !reflect.DeepEqual(got, want) || metas != 1 {
			t.Fatalf("database holds %+v and %d meta rows, want %+v and 1", got, metas, want)
		}
		// Orders move the stock; seeding again must not reset it.
		mustExec(t, db, `UPDATE shop_products SET stock = 3 WHERE sku = 'SKU-1'`)
		if err := shop.Seed(ctx, db, b.dialect, c); err != nil {
			t.Fatalf("second seed: %v", err)
		}
		other := c
		other.Products = append([]shop.Product{{SKU: "TEA-1", Name: "Tea", PriceCents: 450, Stock: 7}}, c.Products...)
		if err := shop.Seed(ctx, db, b.dialect, other); !errors.Is(err, shop.ErrCatalogMismatch) {
			t.Fatalf("seed with another catalogue: %v, want ErrCatalogMismatch", err)
		}
		got, metas = catalogRows(t, db)
		want := sortedCatalog(c)
		for i := range want.Products {
			if want.Products[i].SKU == "SKU-1" {
				want.Products[i].Stock = 3
			}
		}
		if !reflect.DeepEqual(got, want) || metas != 1 {
			t.Fatalf("after reseeding: %+v and %d meta rows, want %+v and 1", got, metas, want)
		}
	})
}

// Several shopd processes starting at once on one fresh database with one
// -catalog seed it once; shopd started later on that database with another
// catalogue refuses to start and says why.
func TestShopdSeedsOnceAcrossProcesses(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		db, dbArg := b.fresh(t)
		c := shop.Catalog{
			Products: []shop.Product{{SKU: "TEA-1", Name: "Tea", PriceCents: 450, Stock: 7}, {SKU: "CUP-1", Name: "Cup", PriceCents: 900, Stock: 3}},
			Coupons:  []shop.Coupon{{ID: 4, Name: "2 off", DiscountCents: 200, Total: 5}},
		}
		path := writeCatalog(t, c)
		procs := []*shopd{
			spawnShopd(t, "-db", dbArg, "-catalog", path),
			spawnShopd(t, "-db", dbArg, "-catalog", path),
			spawnShopd(t, "-db", dbArg, "-catalog", path),
		}
		for _, p := range procs {
			p.ready()
		}
		r := do(t, "GET", procs[1].base+"/products", "", "", "")
		var products []shop.Product
		if err := json.Unmarshal(r.body, &products); r.status != http.StatusOK || err != nil {
			t.Fatalf("GET /products: %d %s", r.status, r.body)
		}
		if want := sortedCatalog(c).Products; !reflect.DeepEqual(products, want) {
			t.Errorf("GET /products: %+v, want %+v", products, want)
		}
		for _, p := range procs {
			p.stop()
		}
		got, metas := catalogRows(t, db)
		if want := sortedCatalog(c); !reflect.DeepEqual(got, want) || metas != 1 {
			t.Fatalf("database holds %+v and %d meta rows, want %+v and 1", got, metas, want)
		}

		// The default catalogue on this database: refused before serving.
		var stdout, stderr bytes.Buffer
		err := shop.Run(t.Context(), []string{"-addr", "127.0.0.1:0", "-db", dbArg}, &stdout, &stderr)
		if !errors.Is(err, shop.ErrCatalogMismatch) || !strings.Contains(err.Error(), "-catalog") {
			t.Fatalf("Run with another catalogue: %v, want a -catalog error wrapping ErrCatalogMismatch", err)
		}
		if strings.Contains(stdout.String(), "listening") {
			t.Errorf("shopd served with a catalogue other than its database's: %s", stdout.String())
		}
		if got2, _ := catalogRows(t, db); !reflect.DeepEqual(got2, got) {
			t.Errorf("the refused start changed the catalogue: %+v", got2)
		}
	})
}

// postOrder posts an order as user and decodes the answer: its status,
// the order (on 201) or the problem code.
func postOrder(t *testing.T, s http.Handler, user int64, key, body string) (int, shop.Order, string) {
	t.Helper()
	rec := serve(s, "POST", "/orders", map[string]string{"X-User-ID": strconv.FormatInt(user, 10), "Idempotency-Key": key, "Content-Type": "application/json"}, body)
	if rec.Code != http.StatusCreated {
		return rec.Code, shop.Order{}, problemCode(t, rec)
	}
	var o shop.Order
	if err := json.Unmarshal(rec.Body.Bytes(), &o); err != nil {
		t.Fatal(err)
	}
	return rec.Code, o, ""
}

// stockOf reads a product's stock from the database.
func stockOf(t *testing.T, db *sql.DB, d sqlstore.Dialect, sku string) int64 {
	t.Helper()
	var n int64
	q := `SELECT stock FROM shop_products WHERE sku = ?`
	if d == sqlstore.PostgreSQL {
		q = `SELECT stock FROM shop_products WHERE sku = $1`
	}
	if err := db.QueryRow(q, sku).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// countRows counts the rows of a query's COUNT(*).
func countRows(t *testing.T, db *sql.DB, query string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// GET /products lists the catalogue with its stock; an order answers its
// amount (price × quantity, minus a coupon, never below 0) and takes its
// quantity from the stock; an unknown SKU, too large a quantity and an
// unusable coupon are refused and reserve nothing.
func TestProductsStockAndAmounts(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		c := shop.DefaultCatalog()
		c.Products = append(c.Products, shop.Product{SKU: "PIN-1", Name: "Pin", PriceCents: 300, Stock: 5})
		s, db := newShopWith(t, b, c)

		rec := serve(s, "GET", "/products", nil, "")
		var products []shop.Product
		if err := json.Unmarshal(rec.Body.Bytes(), &products); rec.Code != 200 || err != nil || rec.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("GET /products: %d %q %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
		}
		if want := sortedCatalog(c).Products; !reflect.DeepEqual(products, want) {
			t.Fatalf("GET /products: %+v, want %+v", products, want)
		}

		status, o, _ := postOrder(t, s, 1, "two", `{"sku":"SKU-1","quantity":2}`)
		if status != 201 || o.AmountCents != 2*1299 || o.CouponID != 0 || o.Status != shop.StatusWaitPay {
			t.Fatalf("order of 2 SKU-1: %d %+v, want 201 amount %d", status, o, 2*1299)
		}
		var amount, reserved int64
		if err := db.QueryRow(`SELECT amount_cents, reserved_qty FROM shop_orders WHERE order_no = '`+o.OrderNo+`'`).Scan(&amount, &reserved); err != nil || amount != 2*1299 || reserved != 2 {
			t.Fatalf("order row: amount %d reserved %d (%v), want %d and 2", amount, reserved, err, 2*1299)
		}
		if got := stockOf(t, db, b.dialect, "SKU-1"); got != 98 {
			t.Fatalf("SKU-1 stock %d, want 98", got)
		}
		rec = serve(s, "GET", "/products", nil, "")
		if !strings.Contains(rec.Body.String(), `{"sku":"SKU-1","name":"Notebook","price_cents":1299,"stock":98}`) {
			t.Errorf("GET /products after an order: %s", rec.Body)
		}

		for _, c := range []struct {
			name, body, code string
			status           int
		}{
			{"unknown sku", `{"sku":"NOPE-1","quantity":1}`, "UNKNOWN_SKU", 400},
			{"more than left", `{"sku":"SKU-1","quantity":99}`, "OUT_OF_STOCK", 409},
			{"unclaimed coupon", `{"sku":"SKU-1","quantity":1,"coupon_id":1}`, "COUPON_NOT_USABLE", 409},
			{"unknown coupon", `{"sku":"SKU-1","quantity":1,"coupon_id":77}`, "COUPON_NOT_USABLE", 409},
		} {
			status, _, code := postOrder(t, s, 1, "refused-"+c.name, c.body)
			if status != c.status || code != c.code {
				t.Errorf("%s: %d %s, want %d %s", c.name, status, code, c.status, c.code)
			}
		}
		if got := stockOf(t, db, b.dialect, "SKU-1"); got != 98 {
			t.Fatalf("SKU-1 stock %d after refused orders, want 98 (nothing reserved)", got)
		}
		if n := countRows(t, db, `SELECT COUNT(*) FROM shop_orders`); n != 1 {
			t.Fatalf("%d orders after refusals, want 1", n)
		}

		// A claimed coupon: used once, by one order, for its discount.
		claim := func(user int64) {
			mustExec(t, db, fmt.Sprintf(`INSERT INTO shop_coupon_claims (coupon_id, user_id, status, claimed_ms) VALUES (1, %d, 'UNUSED', 0)`, user))
		}
		claim(2)
		status, o, _ = postOrder(t, s, 2, "coupon", `{"sku":"BOOK-1","quantity":1,"coupon_id":1}`)
		if status != 201 || o.AmountCents != 2500-500 || o.CouponID != 1 {
			t.Fatalf("order with coupon: %d %+v, want amount %d", status, o, 2500-500)
		}
		var claimStatus, claimOrder string
		if err := db.QueryRow(`SELECT status, order_no FROM shop_coupon_claims WHERE user_id = 2`).Scan(&claimStatus, &claimOrder); err != nil || claimStatus != "USED" || claimOrder != o.OrderNo {
			t.Fatalf("claim after use: %s %s (%v), want USED by %s", claimStatus, claimOrder, err, o.OrderNo)
		}
		if status, _, code := postOrder(t, s, 2, "coupon-again", `{"sku":"BOOK-1","quantity":1,"coupon_id":1}`); status != 409 || code != "COUPON_NOT_USABLE" {
			t.Fatalf("second use of a claim: %d %s", status, code)
		}
		if got := stockOf(t, db, b.dialect, "BOOK-1"); got != 999 {
			t.Fatalf("BOOK-1 stock %d, want 999 (the refused second use reserved nothing)", got)
		}
		// A discount larger than the price: the amount is 0, not negative.
		claim(3)
		if status, o, _ = postOrder(t, s, 3, "free", `{"sku":"PIN-1","quantity":1,"coupon_id":1}`); status != 201 || o.AmountCents != 0 {
			t.Fatalf("order of a 300-cent pin with 500 off: %d %+v, want amount 0", status, o)
		}
	})
}

// 150 concurrent orders with distinct keys for SKU-1 (stock 100): exactly
// 100 orders exist, the stock is 0 (the stock never goes below 0: a CHECK
// refuses it, and stock plus reserved quantities stays 100), and the
// other 50 are answered 409 OUT_OF_STOCK. A client answered 503 (the
// store did not answer in time: a loaded machine) or 409 PROCESSING
// retries with its key, as a client does, until it gets an answer.
func TestConcurrentOrdersNeverOversell(t *testing.T) {
	forIsolations(t, func(t *testing.T, b backend) {
		s, db := newShop(t, b)
		const n = 150
		codes := make([]string, n)
		statuses := make([]int, n)
		var retries atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		deadline := time.Now().Add(2 * time.Minute)
		for i := range n {
			wg.Go(func() {
				<-start
				for {
					statuses[i], _, codes[i] = postOrder(t, s, int64(i%30+1), "oversell-"+strconv.Itoa(i), `{"sku":"SKU-1","quantity":1}`)
					unanswered := statuses[i] == 503 || (statuses[i] == 409 && codes[i] == "PROCESSING")
					if !unanswered || time.Now().After(deadline) {
						return
					}
					retries.Add(1)
					time.Sleep(50 * time.Millisecond)
				}
			})
		}
		close(start)
		wg.Wait()
		t.Logf("%s: %d retries after 503 or 409 PROCESSING", b.name, retries.Load())
		created, outOfStock := 0, 0
		for i := range n {
			switch {
			case statuses[i] == 201:
				created++
			case statuses[i] == 409 && codes[i] == "OUT_OF_STOCK":
				outOfStock++
			default:
				t.Errorf("order %d: %d %s", i, statuses[i], codes[i])
			}
		}
		rows, stock := countRows(t, db, `SELECT COUNT(*) FROM shop_orders WHERE sku = 'SKU-1'`), stockOf(t, db, b.dialect, "SKU-1")
		t.Logf("%s: %d × 201, %d × 409 OUT_OF_STOCK, %d order rows, stock %d", b.name, created, outOfStock, rows, stock)
		if created != 100 || outOfStock != 50 {
			t.Errorf("%d created and %d OUT_OF_STOCK, want 100 and 50", created, outOfStock)
		}
		if rows != 100 {
			t.Errorf("%d order rows, want 100", rows)
		}
		if stock != 0 {
			t.Errorf("stock %d, want 0", stock)
		}
		if reserved := countRows(t, db, `SELECT COALESCE(SUM(reserved_qty), 0) FROM shop_orders WHERE sku = 'SKU-1'`); reserved != 100 {
			t.Errorf("%d reserved in orders, want 100", reserved)
		}
	})
}
