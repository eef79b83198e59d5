package sqlstore_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

// A Store on a SQLite file: open it, migrate it, and guard an effect with
// it. The second call with the same key replays the stored response
// instead of running the work again.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	db, err := sqlite.Open(ctx, filepath.Join(dir, "idem.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	guard, err := idem.NewGuard(store, nil)
	if err != nil {
		log.Fatal(err)
	}

	charges := 0
	charge := func(ctx context.Context) (idem.Response, error) {
		charges++
		return idem.Response{StatusCode: 201, Body: []byte(`{"charge":"ch_1"}`)}, nil
	}
	for range 2 {
		resp, replayed, err := guard.Do(ctx, "customer-42", "order-7", "fp-v1", charge)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(resp.StatusCode, string(resp.Body), "replayed:", replayed)
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201 {"charge":"ch_1"} replayed: false
	// 201 {"charge":"ch_1"} replayed: true
	// charges: 1
}

// Store.CompleteTx stores the response in the transaction that makes the
// effect, so both commit or neither does. Through the Guard, work calls
// idem.FromContext(ctx).CompleteTx with its transaction.
func ExampleStore_CompleteTx() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(ctx, filepath.Join(dir, "shop.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	guard, err := idem.NewGuard(store, nil)
	if err != nil {
		log.Fatal(err)
	}

	placeOrder := func(ctx context.Context) (idem.Response, error) {
		tx, err := db.BeginTx(ctx, nil) // IMMEDIATE: sqlite.Open sets _txlock=immediate
		if err != nil {
			return idem.Response{}, err
		}
		defer tx.Rollback()
		// Inside the transaction, use tx only: never db or the store's
		// other methods, which would wait for the connection tx holds.
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, total) VALUES ('ord_1', 4200)`); err != nil {
			return idem.Response{}, err
		}
		resp := idem.Response{StatusCode: 201, Header: map[string][]string{"Location": {"/orders/ord_1"}}}
		if err := idem.FromContext(ctx).CompleteTx(ctx, tx, resp); err != nil {
			return idem.Response{}, err // lease lost: roll the order back
		}
		return resp, tx.Commit()
	}
	for range 2 {
		resp, replayed, err := guard.Do(ctx, "customer-42", "checkout-1", "fp-v1", placeOrder)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(resp.StatusCode, resp.Header["Location"][0], "replayed:", replayed)
	}
	var orders int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&orders); err != nil {
		log.Fatal(err)
	}
	fmt.Println("orders:", orders)
	// Output:
	// 201 /orders/ord_1 replayed: false
	// 201 /orders/ord_1 replayed: true
	// orders: 1
}

// Sweep removes records past their retention; run it now and then (the
// idem command's sweep does). It never removes a live lease.
func ExampleStore_Sweep() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(ctx, filepath.Join(dir, "idem.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	res, err := store.Acquire(ctx, idem.AcquireRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	// Kept for 1 ms only, so that this example has something to sweep.
	if err := store.Complete(ctx, res.Lease, idem.Response{StatusCode: 200}, time.Millisecond); err != nil {
		log.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	n, err := store.Sweep(ctx, 0) // 0: up to idem.DefaultSweepLimit
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("swept:", n)
	// Output:
	// swept: 1
}
