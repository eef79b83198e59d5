package tracing_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/tracing"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/memstore"
)

// TestExportsToTheEndpoint: with OTEL_EXPORTER_OTLP_ENDPOINT set, a
// request's span reaches the collector (an OTLP/HTTP POST to /v1/traces)
// by the time Shutdown returns; without it, nothing is set up.
func TestExportsToTheEndpoint(t *testing.T) {
	var posts, bytes atomic.Int64
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/traces" {
			n, _ := io.Copy(io.Discard, r.Body)
			posts.Add(1)
			bytes.Add(n)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer collector.Close()

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	if tr, err := tracing.Start(context.Background(), "test"); tr != nil || err != nil {
		t.Fatalf("Start without an endpoint = %v, %v; want nil, nil", tr, err)
	}

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	tr, err := tracing.Start(context.Background(), "test")
	if err != nil || tr == nil || tr.Observer() == nil {
		t.Fatalf("Start = %v, %v", tr, err)
	}
	srv := httptest.NewServer(tr.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/orders", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if posts.Load() != 0 {
		t.Log("spans exported before Shutdown (the batcher's interval passed)")
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if posts.Load() == 0 || bytes.Load() == 0 {
		t.Fatal("the collector received no spans")
	}
}

// collect starts a collector that keeps the bodies of the OTLP/HTTP posts
// it receives, and points the exporter at it.
func collect(t *testing.T) func() []byte {
	t.Helper()
	var (
		mu   sync.Mutex
		body []byte
	)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		body = append(body, b...)
		mu.Unlock()
	}))
	t.Cleanup(collector.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "none")
	return func() []byte {
		mu.Lock()
		defer mu.Unlock()
		return bytes.Clone(body)
	}
}

// TestMethodsOutsideHTTPAreNotNamed: a client's made-up methods do not
// become span names or attribute values (every one would be a span name
// of its own in the collector): they are exported as "HTTP" and
// "_OTHER", while a known method keeps its name.
func TestMethodsOutsideHTTPAreNotNamed(t *testing.T) {
	exported := collect(t)
	tr, err := tracing.Start(context.Background(), "test")
	if err != nil || tr == nil {
		t.Fatalf("Start = %v, %v", tr, err)
	}
	srv := httptest.NewServer(tr.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	defer srv.Close()
	var made []string
	for i := range 20 {
		m := "XMETHOD" + strconv.Itoa(i) + "QZ"
		made = append(made, m)
		req, _ := http.NewRequest(m, srv.URL+"/orders", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	req, _ := http.NewRequest(http.MethodDelete, srv.URL+"/orders", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	body := exported()
	for _, m := range made {
		if bytes.Contains(body, []byte(m)) {
			t.Errorf("the method %q a client made up was exported", m)
		}
	}
	for _, want := range []string{"_OTHER", "HTTP", http.MethodDelete} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("the export has no %q", want)
		}
	}
}

// TestMalformedEndpointIsRefused: an endpoint that is not an http(s) URL
// with a host makes Start fail with an error naming the variable (the
// exporter would log it and send to its default address instead), and a
// well-formed one is accepted.
func TestMalformedEndpointIsRefused(t *testing.T) {
	for _, tc := range []struct{ name, value string }{
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "://collector"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://[::1"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://collector"},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http:///v1/traces"},
	} {
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
		t.Setenv(tc.name, tc.value)
		tr, err := tracing.Start(context.Background(), "test")
		if err == nil || tr != nil {
			_ = tr.Shutdown(context.Background())
			t.Errorf("%s=%q: Start = %v, %v; want an error", tc.name, tc.value, tr, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%s=%q: the error %q does not name the variable", tc.name, tc.value, err)
		}
	}
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector.example:4318")
	tr, err := tracing.Start(context.Background(), "test")
	if err != nil || tr == nil {
		t.Fatalf("Start with a well-formed endpoint = %v, %v", tr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // nothing to flush; do not wait for the unreachable host
	_ = tr.Shutdown(ctx)
}

// TestExportHasNoKey: the OTLP payload of guarded requests (executed,
// replayed, mismatched, refused as in flight, released by a 5xx) carries
// the key's hash and the outcomes, never the key, the scope or the path's
// id.
func TestExportHasNoKey(t *testing.T) {
	exported := collect(t)
	tr, err := tracing.Start(context.Background(), "test")
	if err != nil || tr == nil {
		t.Fatalf("Start = %v, %v", tr, err)
	}
	const key, scope, id = "secret-key-Qx81", "user-55501", "order-99173"
	mw, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil), Observer: tr.Observer(), StoreName: "memory",
		Scope: func(*http.Request) (string, error) { return scope, nil }})
	if err != nil {
		t.Fatal(err)
	}
	block, blocked := make(chan struct{}), make(chan struct{}, 1)
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{id}", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Block") != "" {
			blocked <- struct{}{}
			<-block
		}
		if r.Header.Get("X-Fail") != "" {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	srv := httptest.NewServer(tr.Handler(mux))
	defer srv.Close()
	post := func(k, body string, hdr ...string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders/"+id, strings.NewReader(body))
		req.Header.Set("Idempotency-Key", k)
		for _, h := range hdr {
			req.Header.Set(h, "1")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i, c := range []struct {
		key, body string
		hdr       []string
		want      int
	}{
		{key, "a", nil, 201}, {key, "a", nil, 201}, {key, "b", nil, 422}, {key + "-5xx", "a", []string{"X-Fail"}, 500},
	} {
		if got := post(c.key, c.body, c.hdr...); got != c.want {
			t.Fatalf("request %d: %d, want %d", i, got, c.want)
		}
	}
	done := make(chan int)
	go func() { done <- post(key+"-busy", "a", "X-Block") }()
	<-blocked
	if got := post(key+"-busy", "a"); got != http.StatusConflict {
		t.Fatalf("a retry during the execution: %d, want 409", got)
	}
	close(block)
	if got := <-done; got != 201 {
		t.Fatalf("the blocked execution: %d", got)
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	body := exported()
	for _, secret := range []string{key, scope, id} {
		if bytes.Contains(body, []byte(secret)) {
			t.Errorf("the export holds %q", secret)
		}
	}
	for _, want := range []string{idem.HashKey(scope, key), "executed", "replayed", "mismatch", "in_flight", "released", "POST /orders/{id}"} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("the export lacks %q", want)
		}
	}
}

// TestShutdownBoundedByItsContext: a collector that never answers does
// not hold the program's exit: Shutdown returns, with an error, when its
// context ends (shopd and idem proxy give it 5 s).
func TestShutdownBoundedByItsContext(t *testing.T) {
	stop := make(chan struct{})
	var posts atomic.Int64
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		<-stop
	}))
	defer collector.Close()
	defer close(stop)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	tr, err := tracing.Start(context.Background(), "test")
	if err != nil || tr == nil {
		t.Fatalf("Start = %v, %v", tr, err)
	}
	srv := httptest.NewServer(tr.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/orders", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- tr.Shutdown(ctx) }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Shutdown against a collector that never answers returned no error")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Shutdown did not return after its context ended")
	}
	if posts.Load() == 0 {
		t.Error("the export never reached the collector")
	}
}

// TestExportTurnedOff: OTEL_SDK_DISABLED=true (in any case) and
// OTEL_TRACES_EXPORTER=none turn the export off, as OpenTelemetry's SDKs
// do: no span leaves the process, and an endpoint, even a malformed one,
// is neither used nor refused. An endpoint that is only blanks is not
// set, as the exporter reads it.
func TestExportTurnedOff(t *testing.T) {
	var posts atomic.Int64
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
	}))
	defer collector.Close()
	for _, tc := range []struct{ name, value, endpoint string }{
		{"OTEL_SDK_DISABLED", "true", collector.URL},
		{"OTEL_SDK_DISABLED", "TRUE", "collector:4318"},
		{"OTEL_TRACES_EXPORTER", "none", collector.URL},
		{"OTEL_TRACES_EXPORTER", " None ", "ftp://collector"},
		{"OTEL_SDK_DISABLED", "", "   "},
	} {
		t.Setenv("OTEL_SDK_DISABLED", "")
		t.Setenv("OTEL_TRACES_EXPORTER", "")
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
		t.Setenv(tc.name, tc.value)
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", tc.endpoint)
		if err := tracing.CheckEnv(); err != nil {
			t.Errorf("%s=%q, endpoint %q: CheckEnv = %v, want nil", tc.name, tc.value, tc.endpoint, err)
		}
		if tracing.Enabled() {
			t.Errorf("%s=%q, endpoint %q: Enabled", tc.name, tc.value, tc.endpoint)
		}
		tr, err := tracing.Start(context.Background(), "test")
		if tr != nil || err != nil {
			t.Errorf("%s=%q, endpoint %q: Start = %v, %v; want nil, nil", tc.name, tc.value, tc.endpoint, tr, err)
			if tr != nil {
				_ = tr.Shutdown(context.Background())
			}
		}
	}
	if n := posts.Load(); n != 0 {
		t.Fatalf("the collector received %d posts from an export that was turned off", n)
	}
	// A value that is neither otlp nor none names an exporter these
	// programs do not have: a configuration error, not a silent default.
	t.Setenv("OTEL_SDK_DISABLED", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "zipkin")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	if err := tracing.CheckEnv(); err == nil || !strings.Contains(err.Error(), "OTEL_TRACES_EXPORTER") {
		t.Fatalf("OTEL_TRACES_EXPORTER=zipkin: CheckEnv = %v, want an error naming the variable", err)
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	if err := tracing.CheckEnv(); err != nil || !tracing.Enabled() {
		t.Fatalf("OTEL_TRACES_EXPORTER=otlp: CheckEnv = %v, Enabled %v", err, tracing.Enabled())
	}
}

// TestEndpointAsTheExporterReadsIt: the check reads the endpoints as the
// exporter does. Blanks around a value are trimmed (the exporter trims
// them), and a traces endpoint replaces the generic one: a malformed
// generic endpoint beside a good traces endpoint is not used, spans go to
// the traces endpoint, and nothing is refused.
func TestEndpointAsTheExporterReadsIt(t *testing.T) {
	var posts atomic.Int64
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/custom/traces" {
			posts.Add(1)
		}
	}))
	defer collector.Close()
	t.Setenv("OTEL_SDK_DISABLED", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", " "+collector.URL+"/custom/traces\t")
	tr, err := tracing.Start(context.Background(), "test")
	if err != nil || tr == nil {
		t.Fatalf("Start = %v, %v", tr, err)
	}
	srv := httptest.NewServer(tr.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if posts.Load() == 0 {
		t.Fatal("no span reached the traces endpoint")
	}
	// The generic endpoint alone, malformed, is still refused.
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	if err := tracing.CheckEnv(); err == nil || !strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_ENDPOINT") {
		t.Fatalf("a malformed generic endpoint alone: CheckEnv = %v", err)
	}
}
