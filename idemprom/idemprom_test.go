package idemprom_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemprom"
	"github.com/idemkit/idem/internal/metricstest"
	"github.com/idemkit/idem/memstore"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// downStore fails Acquire while down is set.
type downStore struct {
	idem.Store
	mu   sync.Mutex
	down bool
}

var errDown = errors.New("store down")

func (s *downStore) Acquire(ctx context.Context, req idem.AcquireRequest) (idem.AcquireResult, error) {
	s.mu.Lock()
	down := s.down
	s.mu.Unlock()
	if down {
		return idem.AcquireResult{}, errDown
	}
	return s.Store.Acquire(ctx, req)
}

// TestMetricsThroughMiddleware drives the real middleware on memstore,
// behind a ServeMux route, and scrapes the real promhttp handler over
// HTTP after each step: the counters move exactly as the outcomes happen,
// the store histogram counts the acquires and completions, and no key or
// scope appears anywhere in the output.
func TestMetricsThroughMiddleware(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := idemprom.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idemprom.New(reg, nil); err == nil {
		t.Error("a second Observer on one registry was accepted")
	}
	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer metrics.Close()

	const scope = "tenant-SCOPE-7731"
	store := &downStore{Store: memstore.New(nil)}
	block := make(chan struct{})
	blocked := make(chan struct{}, 1)
	mw, err := idemhttp.New(&idemhttp.Config{Store: store, StoreName: "memory", Observer: obs,
		Scope: func(*http.Request) (string, error) { return scope, nil }})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{id}", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Block") != "" {
			blocked <- struct{}{}
			<-block
		}
		w.WriteHeader(http.StatusCreated)
	})))
	api := httptest.NewServer(mux)
	defer api.Close()
	post := func(key, body string, hdr ...string) int {
		req, _ := http.NewRequest(http.MethodPost, api.URL+"/orders/user-USERID-5521", strings.NewReader(body))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	req := func(outcome string) string {
		return `idem_requests_total{outcome="` + outcome + `",route="POST /orders/{id}"}`
	}
	want := map[string]float64{}
	check := func(step string) {
		t.Helper()
		got, _ := metricstest.Scrape(t, metrics.URL)
		for series, v := range want {
			if got[series] != v {
				t.Errorf("%s: %s = %v, want %v", step, series, got[series], v)
			}
		}
	}

	const key1, key2 = "KEY-ALPHA-90817", "KEY-BRAVO-33610"
	if s := post(key1, `{}`); s != http.StatusCreated {
		t.Fatalf("first: %d", s)
	}
	want[req("executed")] = 1
	want[`idem_request_duration_seconds_count{outcome="executed",route="POST /orders/{id}"}`] = 1
	want[`idem_store_operation_duration_seconds_count{operation="acquire",result="ok",store="memory"}`] = 1
	want[`idem_store_operation_duration_seconds_count{operation="complete",result="ok",store="memory"}`] = 1
	check("executed")

	if s := post(key1, `{}`); s != http.StatusCreated {
		t.Fatalf("replay: %d", s)
	}
	want[req("replayed")] = 1
	want[`idem_store_operation_duration_seconds_count{operation="acquire",result="ok",store="memory"}`] = 2
	check("replayed")

	if s := post(key1, `{"other":1}`); s != http.StatusUnprocessableEntity {
		t.Fatalf("mismatch: %d", s)
	}
	want[req("mismatch")] = 1
	want[`idem_store_operation_duration_seconds_count{operation="acquire",result="ok",store="memory"}`] = 3
	check("mismatch")

	if s := post("", `{}`); s != http.StatusBadRequest {
		t.Fatalf("missing key: %d", s)
	}
	want[req("missing_key")] = 1
	check("missing key")

	done := make(chan int)
	go func() { done <- post(key2, `{}`, "X-Block", "1") }()
	<-blocked
	if s := post(key2, `{}`); s != http.StatusConflict {
		t.Fatalf("in flight: %d", s)
	}
	close(block)
	if s := <-done; s != http.StatusCreated {
		t.Fatalf("blocked first: %d", s)
	}
	want[req("in_flight")] = 1
	want[req("executed")] = 2
	want[`idem_request_duration_seconds_count{outcome="executed",route="POST /orders/{id}"}`] = 2
	want[`idem_store_operation_duration_seconds_count{operation="acquire",result="ok",store="memory"}`] = 5
	want[`idem_store_operation_duration_seconds_count{operation="complete",result="ok",store="memory"}`] = 2
	check("in flight")

	store.mu.Lock()
	store.down = true
	store.mu.Unlock()
	if s := post("KEY-CHARLIE-4410", `{}`); s != http.StatusServiceUnavailable {
		t.Fatalf("store error: %d", s)
	}
	want[req("store_error")] = 1
	want[`idem_store_errors_total{operation="acquire",store="memory"}`] = 1
	want[`idem_store_operation_duration_seconds_count{operation="acquire",result="error",store="memory"}`] = 1
	check("store error")

	_, raw := metricstest.Scrape(t, metrics.URL)
	for _, secret := range []string{key1, key2, "KEY-CHARLIE", scope, "USERID", idem.HashKey(scope, key1)} {
		if strings.Contains(raw, secret) {
			t.Errorf("the metrics show %q", secret)
		}
	}
}

// TestOtherKinds: the events of the other parts (leases, sweeps, locks,
// tokens, inbox, outbox) move their metrics.
func TestOtherKinds(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := idemprom.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, e := range []idem.Event{
		{Kind: idem.KindLease, Outcome: idem.OutcomeRenewed},
		{Kind: idem.KindLease, Outcome: idem.OutcomeRenewed},
		{Kind: idem.KindLease, Outcome: idem.OutcomeRenewFailed},
		{Kind: idem.KindLease, Outcome: idem.OutcomeLost},
		{Kind: idem.KindSweep, Op: idem.SweepRecords, Store: "postgres", N: 7},
		{Kind: idem.KindLock, Outcome: idem.OutcomeContended},
		{Kind: idem.KindToken, Op: idem.OpConsume, Outcome: idem.OutcomeUsed},
		{Kind: idem.KindInbox, Route: "billing", Outcome: idem.OutcomeDuplicate},
		{Kind: idem.KindOutbox, Op: idem.OpPublish, Route: "orders", N: 3},
		{Kind: idem.KindOutbox, Op: idem.OpBacklog, Route: "orders", N: 12, Age: 1500 * 1e6},
	} {
		obs.End(ctx, e)
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	got, _ := metricstest.Scrape(t, srv.URL)
	for series, v := range map[string]float64{
		`idem_lease_renewals_total{result="renewed"}`:                    2,
		`idem_lease_renewals_total{result="renew_failed"}`:               1,
		`idem_leases_lost_total`:                                         1,
		`idem_swept_total{store="postgres",what="records"}`:              7,
		`idem_lock_operations_total{result="contended"}`:                 1,
		`idem_token_operations_total{operation="consume",result="used"}`: 1,
		`idem_inbox_messages_total{group="billing",result="duplicate"}`:  1,
		`idem_outbox_published_total{relay="orders"}`:                    3,
		`idem_outbox_backlog{relay="orders"}`:                            12,
		`idem_outbox_lag_seconds{relay="orders"}`:                        1.5,
	} {
		if got[series] != v {
			t.Errorf("%s = %v, want %v", series, got[series], v)
		}
	}
}
