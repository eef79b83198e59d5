package shop_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
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
// the order's transaction, no read of the record after it, and neither
// the key nor the user id.
func TestMetrics(t *testing.T) {
	s, srv := metricsShop(t)

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
	out := scrapeText(t, srv)
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
	// The order's transaction committed its stored answer: the
	// execution knows it, and asks the store nothing after the commit.
	if strings.Contains(out, `operation="get"`) {
		t.Errorf("the store was read after the order's commit")
	}
	if strings.Contains(out, key) || strings.Contains(out, user) {
		t.Errorf("the scrape shows the key or the user id")
	}
	if t.Failed() {
		t.Log(out)
	}
}

// TestCallbackReadsNoRecordBack: a payment callback applied through the
// middleware commits the payment and its stored answer together, and the
// record is not read back after the commit; its repeat is a replay.
func TestCallbackReadsNoRecordBack(t *testing.T) {
	s, srv, db := metricsShopOn(t, sqliteBackend)
	o := placeOrder(t, s, 31, 1)
	body := callbackBody(o.OrderNo, "TRADE-NOREAD-1", o.AmountCents, shop.PaymentSuccess)
	for range 2 {
		wantSuccess(t, callback(s, body))
	}
	if n := payCount(t, db, sqliteBackend, `SELECT COUNT(*) FROM shop_payments WHERE trade_no = ?`, "TRADE-NOREAD-1"); n != 1 {
		t.Fatalf("%d payment rows, want 1", n)
	}
	out := scrapeText(t, srv)
	for _, want := range []string{
		`idem_requests_total{outcome="executed",route="POST /payments/callback"} 1`,
		`idem_requests_total{outcome="replayed",route="POST /payments/callback"} 1`,
		`idem_store_operation_duration_seconds_count{operation="complete_tx",result="ok",store="sqlite"} 2`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the scrape lacks %s", want)
		}
	}
	if strings.Contains(out, `operation="get"`) {
		t.Errorf("the store was read after a commit")
	}
	if t.Failed() {
		t.Log(out)
	}
}

// scrapeText returns the text of srv's GET /metrics.
func scrapeText(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// metricsShop returns a shop on a fresh SQLite database whose requests
// report to idemprom, with its /metrics, and a server of it.
func metricsShop(t *testing.T) (*shop.Shop, *httptest.Server) {
	t.Helper()
	s, srv, _ := metricsShopOn(t, sqliteBackend)
	return s, srv
}

// metricsShopOn is metricsShop on a fresh database of b, which it
// returns too.
func metricsShopOn(t *testing.T, b backend) (*shop.Shop, *httptest.Server, *sql.DB) {
	t.Helper()
	db, _ := b.fresh(t)
	ctx := context.Background()
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
	if err := shop.Seed(ctx, db, b.dialect, shop.DefaultCatalog()); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	obs, err := idemprom.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := shop.New(shop.Config{DB: db, Dialect: b.dialect, Store: store, Observer: obs, Provider: testProvider(t), PaySecret: testPaySecret,
		Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, srv, db
}

// TestCloseJobSweepsAreMetered: what a pass of the close job deletes
// (sent events, finished consume records, expired submit tokens) is
// counted in idem_swept_total by the database's name and what was swept,
// row for row, on the shop's /metrics.
func TestCloseJobSweepsAreMetered(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, srv, db := metricsShopOn(t, b)
		// Three cancelled orders: three events relayed to the loyalty
		// consumer: three sent rows, three finished consume records.
		for user := range int64(3) {
			o := placeOrder(t, s, user+1, 1)
			if code, _, problem := cancel(t, s, user+1, o.OrderNo); code != 200 {
				t.Fatalf("cancel: %d %s", code, problem)
			}
		}
		deliverAll(t, s, db, b.dialect, 1)
		rows := idsOf(t, db, `SELECT id FROM idem_outbox WHERE sent_at IS NOT NULL ORDER BY id`)
		if len(rows) != 3 || countRows(t, db, `SELECT COUNT(*) FROM idem_inbox`) != 3 {
			t.Fatalf("sent rows %v; want 3, and 3 consume records", rows)
		}
		// Two of each older than the retention (a week), one fresh; two
		// expired tokens and a live one.
		const day = 24 * 60 * 60 * 1000
		for _, row := range rows[:2] {
			mustExec(t, db, fmt.Sprintf(`UPDATE idem_outbox SET sent_at = sent_at - %d WHERE id = %s`, 8*day, row))
			mustExec(t, db, fmt.Sprintf(`UPDATE idem_inbox SET updated_at = updated_at - %d WHERE message_id = '%s'`, 8*day, eventID(t, db, row)))
		}
		issue := func() {
			t.Helper()
			if rec := serve(s, "POST", "/tokens", map[string]string{"X-User-ID": "5"}, ""); rec.Code != 201 {
				t.Fatalf("POST /tokens: %d %s", rec.Code, rec.Body)
			}
		}
		issue()
		issue()
		mustExec(t, db, `UPDATE idem_tokens SET expires_at = 1`)
		issue()
		swept := func() map[string]string {
			t.Helper()
			got := map[string]string{}
			for _, l := range scrape(t, srv) {
				if rest, ok := strings.CutPrefix(l, `idem_swept_total{store="`+b.dialect.String()+`",what="`); ok {
					what, n, _ := strings.Cut(rest, `"} `)
					got[what] = n
				}
			}
			return got
		}
		if got := swept(); len(got) != 0 {
			t.Fatalf("swept before the pass: %v", got)
		}
		c, err := s.NewCloser(nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for range 2 { // the second pass finds nothing more
			if _, err := c.RunOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		want := map[string]string{"outbox": "2", "inbox": "2", "tokens": "2"}
		if got := swept(); !maps.Equal(got, want) {
			t.Errorf("idem_swept_total after two passes: %v, want %v", got, want)
		}
		if got := idsOf(t, db, `SELECT id FROM idem_outbox ORDER BY id`); !slices.Equal(got, rows[2:]) {
			t.Errorf("outbox rows %v after the sweep, want %v", got, rows[2:])
		}
		if got := idsOf(t, db, `SELECT message_id FROM idem_inbox`); !slices.Equal(got, []string{eventID(t, db, rows[2])}) {
			t.Errorf("consume records %v after the sweep, want the fresh one", got)
		}
		if n := countRows(t, db, `SELECT COUNT(*) FROM idem_tokens`); n != 1 {
			t.Errorf("%d tokens after the sweep, want the live one", n)
		}
	})
}

// scrape returns the idem_ lines of s's /metrics.
func scrape(t *testing.T, srv *httptest.Server) []string {
	t.Helper()
	var lines []string
	for _, l := range strings.Split(scrapeText(t, srv), "\n") {
		if strings.HasPrefix(l, "idem_") {
			lines = append(lines, l)
		}
	}
	return lines
}

// TestMetricsBounded: a flood of requests with random paths, made-up
// methods, random keys and user ids adds no series to /metrics beyond
// those of the shop's routes and outcomes, and shows none of what was
// sent.
func TestMetricsBounded(t *testing.T) {
	s, srv := metricsShop(t)
	order := func(key, user string) {
		h := map[string]string{"X-User-ID": user, "Idempotency-Key": key, "Content-Type": "application/json"}
		serve(s, "POST", "/orders", h, `{"sku":"BOOK-1","quantity":1}`)
	}
	order("warm-key-1", "1")
	order("warm-key-1", "1")
	before := len(scrape(t, srv))
	var sent []string
	for i := range 40 {
		n := strconv.Itoa(i)
		key, user, path, method := "flood-key-"+n+"-q9", strconv.Itoa(880000+i), "/x9flood"+n, "FLOOD"+n+"M"
		sent = append(sent, key, user, path, method)
		order(key, user)
		h := map[string]string{"X-User-ID": user, "Idempotency-Key": key}
		serve(s, "POST", path, h, "{}")
		serve(s, method, "/orders", h, "{}")
		serve(s, "POST", "/orders/"+key+"/refunds", h, "{}")
		serve(s, "PATCH", "/orders"+path, h, "{}")
		serve(s, "POST", "/orders", map[string]string{"X-User-ID": user, "Idempotency-Key": key + "\x01"}, "{}")
	}
	after := scrape(t, srv)
	t.Logf("%d idem_ lines before the flood, %d after", before, len(after))
	// The new lines are those of outcomes the warm-up did not have
	// (invalid keys, refunds of unknown orders): a few series of a counter
	// and a histogram (some 30 lines); a label taken from the requests
	// would add at least 40 series of 17 lines each.
	if len(after) > before+100 {
		t.Errorf("%d idem_ lines after the flood, %d before: labels grow with the requests:\n%s", len(after), before, strings.Join(after, "\n"))
	}
	// Only names and labels can carry what a client sent; the samples'
	// values are numbers that may hold any digits (a duration's sum).
	var series []string
	for _, l := range after {
		if i := strings.LastIndexByte(l, ' '); i > 0 {
			l = l[:i]
		}
		series = append(series, l)
	}
	all := strings.Join(series, "\n")
	for _, x := range sent {
		if strings.Contains(all, x) {
			t.Errorf("/metrics shows %q, sent by a client", x)
		}
	}
}
