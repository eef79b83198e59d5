package shop_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/sqlstore"
)

// An order number is whatever the path holds: invalid UTF-8, a NUL byte,
// or a value longer than any order number. PostgreSQL refuses such bytes in
// a text parameter and MySQL in a utf8mb4 comparison; the shop must answer
// 404 NOT_FOUND (no order has that number), not 500.
func TestGetOrderHostileOrderNumbers(t *testing.T) {
	forBackends(t, testGetOrderHostileOrderNumbers)
}

func testGetOrderHostileOrderNumbers(t *testing.T, b backend) {
	s, _ := newShop(t, b)
	for _, no := range []string{"%FF", "ord_%C3%28", "%00", "ord%00x", "%ED%A0%80", strings.Repeat("x", 5000), "%F0%9F%98%80"} {
		rec := serve(s, http.MethodGet, "/orders/"+no, map[string]string{"X-User-ID": "7"}, "")
		if rec.Code != http.StatusNotFound {
			t.Errorf("GET /orders/%.40s: %d %s, want 404", no, rec.Code, rec.Body)
			continue
		}
		if code := problemCode(t, rec); code != "NOT_FOUND" {
			t.Errorf("GET /orders/%.40s: code %q, want NOT_FOUND", no, code)
		}
	}
}

// A path not in clean form is redirected by Go's router before any of the
// shop's handlers runs (PROBLEMS.md): POST //orders creates no order and
// stores nothing, so following the redirect with the same Idempotency-Key
// creates the order once.
func TestUncleanPathRedirectsWithoutEffect(t *testing.T) {
	t.Parallel()
	s, db := newShop(t, sqliteBackend)
	h := map[string]string{"X-User-ID": "8", "Idempotency-Key": "unclean", "Content-Type": "application/json"}
	body := `{"sku":"SKU-1","quantity":2}`
	for _, target := range []string{"http://shop//orders", "http://shop/orders/../orders", "http://shop/orders/x/../../orders"} {
		rec := serve(s, http.MethodPost, target, h, body)
		if rec.Code != http.StatusTemporaryRedirect || rec.Header().Get("Location") != "/orders" {
			t.Errorf("POST %s: %d Location %q, want 307 to /orders", target, rec.Code, rec.Header().Get("Location"))
		}
	}
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM shop_orders WHERE user_id = 8`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d orders after redirects (%v), want 0", n, err)
	}
	rec := serve(s, http.MethodPost, "/orders", h, body)
	if rec.Code != http.StatusCreated || rec.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("POST /orders after the redirect: %d replayed=%q, want a first 201", rec.Code, rec.Header().Get("Idempotent-Replayed"))
	}
	if err := db.QueryRow(`SELECT COUNT(*) FROM shop_orders WHERE user_id = 8`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d orders (%v), want 1", n, err)
	}
}

// cancelAfterAcquire is a store that cancels the request once its key is
// acquired: the client hung up while its order was being made.
type cancelAfterAcquire struct {
	*sqlstore.Store
	cancel context.CancelFunc
}

func (c cancelAfterAcquire) Acquire(ctx context.Context, req idem.AcquireRequest) (idem.AcquireResult, error) {
	res, err := c.Store.Acquire(ctx, req)
	c.cancel()
	return res, err
}

// levelCounter counts log records at Error level.
type levelCounter struct {
	mu     sync.Mutex
	errors []string
}

func (h *levelCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *levelCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		h.mu.Lock()
		h.errors = append(h.errors, r.Message)
		h.mu.Unlock()
	}
	return nil
}
func (h *levelCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *levelCounter) WithGroup(string) slog.Handler      { return h }

// A client that hangs up while its order is being made is no failure of
// the shop: nothing is logged at Error level (any client could fill the
// error log, and page an operator, by hanging up), no order is made, and
// a retry with the same key creates the order.
func TestClientGoneIsNotAnError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := freshSQLite(t)
	store, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := shop.Migrate(ctx, db, sqlstore.SQLite); err != nil {
		t.Fatal(err)
	}
	if err := shop.Seed(ctx, db, sqlstore.SQLite, shop.DefaultCatalog()); err != nil {
		t.Fatal(err)
	}
	reqCtx, cancel := context.WithCancel(ctx)
	logs := &levelCounter{}
	s, err := shop.New(shop.Config{DB: db, Store: cancelAfterAcquire{store, cancel}, Provider: testProvider(t), Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"sku":"SKU-1","quantity":1}`
	req := httptest.NewRequestWithContext(reqCtx, http.MethodPost, "/orders", strings.NewReader(body))
	req.Header.Set("X-User-ID", "51")
	req.Header.Set("Idempotency-Key", "gone")
	req.Header.Set("Content-Type", "application/json")
	s.ServeHTTP(httptest.NewRecorder(), req)
	if len(logs.errors) > 0 {
		t.Errorf("a client that hung up was logged as an error: %q", logs.errors)
	}
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM shop_orders WHERE user_id = 51`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d orders (%v) for a cancelled request, want 0", n, err)
	}

	s2, err := shop.New(shop.Config{DB: db, Store: store, Provider: testProvider(t)})
	if err != nil {
		t.Fatal(err)
	}
	rec := serve(s2, http.MethodPost, "/orders", map[string]string{"X-User-ID": "51", "Idempotency-Key": "gone", "Content-Type": "application/json"}, body)
	if rec.Code != http.StatusCreated {
		t.Fatalf("retry: %d %s", rec.Code, rec.Body)
	}
	if err := db.QueryRow(`SELECT COUNT(*) FROM shop_orders WHERE user_id = 51`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d orders (%v) after the retry, want 1", n, err)
	}
}

// Keys a hostile client may send (multi-byte, quotes, SQL, bidi controls,
// 255 bytes of emoji) with the largest user ID, SKU and quantity the shop
// takes, at the largest price a catalogue takes: each creates one order and
// replays it, on every backend.
func TestHostileKeysOnEveryBackend(t *testing.T) {
	keys := []string{"😀", strings.Repeat("é", 127), `a'b"c\d`, "%s%n", "a b", "'; DROP TABLE shop_orders; --", "\u202e", "\ufeffk", strings.Repeat("😀", 63)}
	longest := strings.Repeat("Z", 64)
	catalog := shop.DefaultCatalog()
	catalog.Products = append(catalog.Products, shop.Product{SKU: longest, Name: "Largest", PriceCents: 1_000_000_000_00, Stock: int64(len(keys)) * shop.MaxQuantity})
	forBackends(t, func(t *testing.T, b backend) {
		s, db := newShopWith(t, b, catalog)
		for _, key := range keys {
			h := map[string]string{"X-User-ID": "9223372036854775807", "Idempotency-Key": key, "Content-Type": "application/json"}
			body := `{"sku":"` + longest + `","quantity":1000}`
			r1 := serve(s, http.MethodPost, "/orders", h, body)
			r2 := serve(s, http.MethodPost, "/orders", h, body)
			if r1.Code != 201 || r2.Code != 201 || r2.Header().Get("Idempotent-Replayed") != "true" || r1.Body.String() != r2.Body.String() {
				t.Errorf("key %q: %d %s / %d %s", key, r1.Code, r1.Body, r2.Code, r2.Body)
			}
		}
		r := serve(s, http.MethodGet, "/orders?limit=500", map[string]string{"X-User-ID": "9223372036854775807"}, "")
		if r.Code != 200 {
			t.Errorf("list: %d %s", r.Code, r.Body)
		}
		var orders, stock int64
		var amount int64
		if err := db.QueryRow(`SELECT COUNT(*), MIN(amount_cents) FROM shop_orders`).Scan(&orders, &amount); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRow(`SELECT stock FROM shop_products WHERE sku = '` + longest + `'`).Scan(&stock); err != nil {
			t.Fatal(err)
		}
		if orders != int64(len(keys)) || stock != 0 || amount != 1_000_000_000_00*shop.MaxQuantity {
			t.Errorf("%d orders, stock %d, amount %d; want %d orders, stock 0, amount %d", orders, stock, amount, len(keys), int64(1_000_000_000_00*shop.MaxQuantity))
		}
	})
}
