package sqlstore_test

import (
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/httpharness"
	"github.com/idemkit/idem/sqlstore"
)

// The idemhttp middleware over the store on SQLite, with the handler
// completing in its own transaction; the harness is idemhttp's
// (internal/httpharness).

// newSQLite opens a fresh, migrated SQLite store (setup) with a business
// table "orders" next to the records.
func newSQLite(t testing.TB) (*sql.DB, *sqlstore.Store) {
	t.Helper()
	db, s := setup(t)
	if _, err := db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, sku TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return db, s
}

func countOrders(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// createOrderTx inserts an order and completes the record in the same
// transaction, then writes something else than what it committed: the
// client must get the committed response. With ?fail=rollback it rolls
// the transaction back after CompleteTx and answers 500.
func createOrderTx(db *sql.DB) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		body, _ := io.ReadAll(r.Body)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer func() { _ = tx.Rollback() }()
		res, err := tx.ExecContext(ctx, `INSERT INTO orders (sku) VALUES (?)`, string(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		id, _ := res.LastInsertId()
		resp, err := idemhttp.JSONResponse(http.StatusCreated, map[string]any{"id": id})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		resp.Header["Location"] = []string{fmt.Sprintf("/orders/%d", id)}
		if err := idemhttp.ExecutionFrom(ctx).CompleteTx(ctx, tx, resp); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if r.URL.Query().Get("fail") == "rollback" {
			_ = tx.Rollback()
			http.Error(w, "rolled back", http.StatusInternalServerError)
			return
		}
		if err := tx.Commit(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Set-Cookie", "seen=1")
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "not what was committed")
	}
}

// The handler completes inside its own transaction: the client gets the
// committed response (what every replay serves), not what it wrote.
func TestCompleteTxSQLite(t *testing.T) {
	t.Parallel()
	db, store := newSQLite(t)
	e := httpharness.Setup(t, &idemhttp.Config{Store: store}, createOrderTx(db))

	first := e.Do(http.MethodPost, "/orders", "k", `A-1`)
	if first.Code != http.StatusCreated || first.Body.String() != `{"id":1}` ||
		first.Header().Get("Content-Type") != "application/json" || first.Header().Get("Location") != "/orders/1" {
		t.Fatalf("first: %d %v %q", first.Code, first.Header(), first.Body)
	}
	if first.Header().Get("Set-Cookie") != "seen=1" || first.Header().Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("first response headers %v", first.Header())
	}
	replay := e.Do(http.MethodPost, "/orders", "k", `A-1`)
	if replay.Code != first.Code || replay.Body.String() != first.Body.String() ||
		replay.Header().Get("Location") != "/orders/1" || replay.Header().Get(idemhttp.HeaderReplayed) != "true" ||
		replay.Header().Get("Set-Cookie") != "" {
		t.Fatalf("replay: %d %v %q", replay.Code, replay.Header(), replay.Body)
	}
	e.WantCalls(1)
	if n := countOrders(t, db); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
	if rec := e.Record("", "k"); rec.Status != idem.StatusCompleted || string(rec.Response.Body) != `{"id":1}` {
		t.Fatalf("record %+v", rec)
	}
}

// A transaction rolled back after CompleteTx leaves nothing: the record is
// released and a retry runs again.
func TestCompleteTxRollbackSQLite(t *testing.T) {
	t.Parallel()
	db, store := newSQLite(t)
	e := httpharness.Setup(t, &idemhttp.Config{Store: store}, createOrderTx(db))
	w := e.Do(http.MethodPost, "/orders?fail=rollback", "k", `A-1`)
	if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "rolled back") {
		t.Fatalf("rollback: %d %q", w.Code, w.Body)
	}
	e.NoRecord("", "k")
	if n := countOrders(t, db); n != 0 {
		t.Fatalf("%d orders after rollback", n)
	}
	e.Do(http.MethodPost, "/orders?fail=rollback", "k", `A-1`)
	e.WantCalls(2)
	e.NoRecord("", "k")
}

// The core rows on SQLite: replay, mismatch, release, large bodies and
// concurrent duplicates.
func TestSQLiteStore(t *testing.T) {
	t.Parallel()
	t.Run("replay and mismatch", func(t *testing.T) {
		t.Parallel()
		_, store := newSQLite(t)
		e := httpharness.Setup(t, &idemhttp.Config{Store: store}, nil)
		first := e.Do(http.MethodPost, "/things", "k", `{"a":1,"b":2}`)
		replay := e.Do(http.MethodPost, "/things", "k", `{"b":2, "a":1}`)
		if replay.Body.String() != first.Body.String() || replay.Header().Get(idemhttp.HeaderReplayed) != "true" ||
			replay.Header().Get("Set-Cookie") != "" || replay.Header().Get("ETag") != `"v1"` {
			t.Fatalf("replay %d %v %q", replay.Code, replay.Header(), replay.Body)
		}
		httpharness.WantProblem(t, e.Do(http.MethodPost, "/things", "k", `{"a":2}`), http.StatusUnprocessableEntity, idemhttp.CodeKeyMismatch)
		e.WantCalls(1)
	})
	t.Run("release", func(t *testing.T) {
		t.Parallel()
		_, store := newSQLite(t)
		e := httpharness.Setup(t, &idemhttp.Config{Store: store}, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusBadGateway)
		})
		e.Do(http.MethodPost, "/things", "k", `{}`)
		e.NoRecord("", "k")
		e.Do(http.MethodPost, "/things", "k", `{}`)
		e.WantCalls(2)
	})
	t.Run("binary body and omitted body", func(t *testing.T) {
		t.Parallel()
		_, store := newSQLite(t)
		payload := make([]byte, 300)
		for i := range payload {
			payload[i] = byte(i)
		}
		e := httpharness.Setup(t, &idemhttp.Config{Store: store, MaxResponseBody: 256}, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/octet-stream")
			n := 200
			if r.URL.Path == "/big" {
				n = 300
			}
			_, _ = w.Write(payload[:n])
		})
		for _, path := range []string{"/small", "/big"} {
			first := e.Do(http.MethodPost, path, "k"+path, ``)
			replay := e.Do(http.MethodPost, path, "k"+path, ``)
			if path == "/small" && replay.Body.String() != first.Body.String() {
				t.Fatalf("%s: replay body differs", path)
			}
			if path == "/big" && (first.Body.Len() != 300 || replay.Body.Len() != 0 || replay.Header().Get(idemhttp.HeaderBodyOmitted) != "true") {
				t.Fatalf("%s: first %d bytes, replay %d bytes %v", path, first.Body.Len(), replay.Body.Len(), replay.Header())
			}
		}
		e.WantCalls(2)
	})
	t.Run("concurrent duplicates", func(t *testing.T) {
		t.Parallel()
		db, store := newSQLite(t)
		e := httpharness.Setup(t, &idemhttp.Config{Store: store, Wait: 30 * time.Second}, createOrderTx(db))
		const n = 30
		var wg sync.WaitGroup
		responses := make([]*httptest.ResponseRecorder, n)
		for i := range n {
			wg.Go(func() { responses[i] = e.Do(http.MethodPost, "/orders", "same", `A-1`) })
		}
		wg.Wait()
		for _, w := range responses {
			if w.Code != http.StatusCreated || w.Body.String() != `{"id":1}` {
				t.Fatalf("status %d %q", w.Code, w.Body)
			}
		}
		e.WantCalls(1)
		if got := countOrders(t, db); got != 1 {
			t.Fatalf("%d orders, want 1", got)
		}
	})
	t.Run("CompleteTx unsupported on memstore", func(t *testing.T) {
		t.Parallel()
		db, _ := newSQLite(t)
		e := httpharness.Setup(t, nil, createOrderTx(db)) // memstore: CompleteTx fails, the handler answers 500
		w := e.Do(http.MethodPost, "/orders", "k", `A-1`)
		if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), idem.ErrTxUnsupported.Error()) {
			t.Fatalf("%d %q", w.Code, w.Body)
		}
		e.NoRecord("", "k")
	})
}

// A response a handler stores with CompleteTx goes through the same
// filter as a recorded one: only replayable headers are kept, and a body
// over MaxResponseBody is omitted. (idemhttp's test of the same name checks
// the Complete path on memstore.)
func TestHandlerCompletionFiltered(t *testing.T) {
	t.Parallel()
	t.Run("CompleteTx", func(t *testing.T) {
		t.Parallel()
		db, store := newSQLite(t)
		e := httpharness.Setup(t, &idemhttp.Config{Store: store, MaxResponseBody: 64}, func(w http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			defer func() { _ = tx.Rollback() }()
			if _, err := tx.ExecContext(ctx, `INSERT INTO orders (sku) VALUES ('A-1')`); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			resp := httpharness.UnfilteredResponse()
			if err := idemhttp.ExecutionFrom(ctx).CompleteTx(ctx, tx, resp); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if err := tx.Commit(); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if orig := httpharness.UnfilteredResponse(); len(resp.Header) != len(orig.Header) || len(resp.Body) != len(orig.Body) {
				t.Errorf("the handler's response was changed: %+v", resp)
			}
			idemhttp.WriteResponse(w, resp)
		})
		httpharness.CheckCompletionFiltered(t, e)
		if n := countOrders(t, db); n != 1 {
			t.Fatalf("%d orders, want 1", n)
		}
	})
}
