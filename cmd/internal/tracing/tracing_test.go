package tracing_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/cmd/internal/tracing"
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
