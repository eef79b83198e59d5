package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

// The README's quick start, from "var ordersPlaced" to the end of newMux.

var ordersPlaced atomic.Int64 // stands in for the application's database

// userID stands in for the application's authentication: it returns the
// caller's identity, which scopes the caller's keys.
func userID(r *http.Request) (string, error) {
	if u := r.Header.Get("X-User-ID"); u != "" {
		return "user:" + u, nil
	}
	return "", errors.New("not signed in")
}

// createOrder is the handler to guard: its effect must happen once.
func createOrder(w http.ResponseWriter, r *http.Request) {
	n := ordersPlaced.Add(1)
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "order %d\n", n)
}

// newMux routes POST /orders through the middleware, with the records kept
// in db (an SQLite database here).
func newMux(ctx context.Context, db *sql.DB) (*http.ServeMux, error) {
	store, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil { // creates the records' table; safe to repeat
		return nil, err
	}
	mw, err := idemhttp.New(&idemhttp.Config{
		Store: store,
		Scope: userID, // the authenticated caller
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(createOrder)))
	return mux, nil
}

// The README's quick start: an SQLite-backed store and a guarded route
// (newMux). A double click and a retry place one order.
func Example_quickStart() {
	ordersPlaced.Store(0)
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "quickstart")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	db, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	mux, err := newMux(ctx, db)
	if err != nil {
		log.Fatal(err)
	}

	for range 3 { // a double click and a retry
		req := httptest.NewRequest(http.MethodPost, "/orders", nil)
		req.Header.Set("X-User-ID", "42")
		req.Header.Set("Idempotency-Key", "checkout-7f3a")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		fmt.Printf("%d replayed=%q %s", w.Code, w.Header().Get("Idempotent-Replayed"), w.Body)
	}
	fmt.Println("orders placed:", ordersPlaced.Load())
	// Output:
	// 201 replayed="" order 1
	// 201 replayed="true" order 1
	// 201 replayed="true" order 1
	// orders placed: 1
}
