package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/sqlstore"
)

// userID stands in for the application's authentication.
func userID(r *http.Request) (string, error) {
	if u := r.Header.Get("X-User-ID"); u != "" {
		return "user:" + u, nil
	}
	return "", errors.New("not signed in")
}

// The README's quick start: an SQLite-backed store and a guarded route.
func Example_quickStart() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "quickstart")
	defer os.RemoveAll(dir)
	mux := http.NewServeMux()
	charges := 0
	createOrder := func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d\n", charges)
	}

	db, err := sqlstore.OpenSQLite(ctx, filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	mw, err := idemhttp.New(&idemhttp.Config{
		Store: store,
		Scope: func(r *http.Request) (string, error) { return userID(r) }, // the authenticated caller
	})
	if err != nil {
		log.Fatal(err)
	}
	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(createOrder)))

	for range 3 { // a double click and a retry
		req, _ := http.NewRequest(http.MethodPost, "/orders", nil)
		req.Header.Set("X-User-ID", "42")
		req.Header.Set("Idempotency-Key", "checkout-7f3a")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		fmt.Printf("%d replayed=%q %s", w.Code, w.Header().Get("Idempotent-Replayed"), w.Body)
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201 replayed="" order 1
	// 201 replayed="true" order 1
	// 201 replayed="true" order 1
	// charges: 1
}
