package shop_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/idemprom"
	"github.com/idemkit/idem/sqlstore"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// TestMetrics: the shop serves GET /metrics; after an order, its replay
// and a mismatch, the scrape shows each outcome once on the route
// "POST /orders", the SQLite store's acquires and its completion inside
// the order's transaction, and neither the key nor the user id.
func TestMetrics(t *testing.T) {
	db, _ := sqliteBackend.fresh(t)
	ctx := context.Background()
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
	reg := prometheus.NewRegistry()
	obs, err := idemprom.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := shop.New(shop.Config{DB: db, Dialect: sqlstore.SQLite, Store: store, Observer: obs,
		Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	srv := httptest.NewServer(s)
	defer srv.Close()

	const key, user = "ORDER-KEY-66120", "774411"
	h := map[string]string{"X-User-ID": user, "Idempotency-Key": key, "Content-Type": "application/json"}
	for i, tc := range []struct {
		body   string
		status int
	}{{`{"sku":"BOOK-1","quantity":1}`, 201}, {`{"sku":"BOOK-1","quantity":1}`, 201}, {`{"sku":"BOOK-1","quantity":2}`, 422}} {
		if rec := serve(s, "POST", "/orders", h, tc.body); rec.Code != tc.status {
			t.Fatalf("request %d: %d %s", i, rec.Code, rec.Body)
		}
	}
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	out := string(raw)
	for _, want := range []string{
		`idem_requests_total{outcome="executed",route="POST /orders"} 1`,
		`idem_requests_total{outcome="replayed",route="POST /orders"} 1`,
		`idem_requests_total{outcome="mismatch",route="POST /orders"} 1`,
		`idem_store_operation_duration_seconds_count{operation="acquire",result="ok",store="sqlite"} 3`,
		`idem_store_operation_duration_seconds_count{operation="complete_tx",result="ok",store="sqlite"} 1`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the scrape lacks %s", want)
		}
	}
	if strings.Contains(out, key) || strings.Contains(out, user) {
		t.Errorf("the scrape shows the key or the user id")
	}
	if t.Failed() {
		t.Log(out)
	}
}
