package sqlstore_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

// post sends a POST with an Idempotency-Key to h and prints the answer.
func post(h http.Handler, target, key, body string) {
	r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	fmt.Printf("%d %s replayed=%q\n", w.Code, strings.TrimSpace(w.Body.String()), w.Header().Get("Idempotent-Replayed"))
}

// A handler behind the idemhttp middleware whose effect is in the store's
// database completes the record in its own transaction
// (idemhttp.Execution.CompleteTx): the effect and the stored response
// commit together or not at all, and the client gets exactly what every
// replay will serve. The README shows createOrder.
func Example_completeTx() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idemhttp-example")
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
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id INTEGER PRIMARY KEY, sku TEXT)`); err != nil {
		log.Fatal(err)
	}
	mw, err := idemhttp.New(&idemhttp.Config{Store: store})
	if err != nil {
		log.Fatal(err)
	}

	createOrder := func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			idemhttp.WriteProblem(w, http.StatusInternalServerError, "INTERNAL", "", "retry with the same key")
			return
		}
		defer tx.Rollback() // a no-op after Commit
		res, err := tx.ExecContext(ctx, `INSERT INTO orders (sku) VALUES ('A-1')`)
		if err != nil {
			idemhttp.WriteProblem(w, http.StatusInternalServerError, "INTERNAL", "", "retry with the same key")
			return
		}
		id, _ := res.LastInsertId()
		resp, err := idemhttp.JSONResponse(http.StatusCreated, map[string]int64{"id": id})
		if err != nil {
			idemhttp.WriteProblem(w, http.StatusInternalServerError, "INTERNAL", "", "retry with the same key")
			return
		}
		resp.Header["Location"] = []string{fmt.Sprintf("/orders/%d", id)}
		// The record completes in tx: the order and the stored response
		// commit together, or neither does.
		if err := idemhttp.ExecutionFrom(ctx).CompleteTx(ctx, tx, resp); err != nil {
			idemhttp.WriteProblem(w, http.StatusInternalServerError, "INTERNAL", "", "retry with the same key")
			return
		}
		if err := tx.Commit(); err != nil {
			idemhttp.WriteProblem(w, http.StatusInternalServerError, "INTERNAL", "", "retry with the same key")
			return
		}
		idemhttp.WriteResponse(w, resp) // the client gets exactly what replays serve
	}
	h := mw.Handler(http.HandlerFunc(createOrder))

	post(h, "/orders", "order-1", `{"sku":"A-1"}`)
	post(h, "/orders", "order-1", `{"sku":"A-1"}`)
	var n int
	_ = db.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&n)
	fmt.Println("orders:", n)
	// Output:
	// 201 {"id":1} replayed=""
	// 201 {"id":1} replayed="true"
	// orders: 1
}
