package obsbench_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/idemprom"
	"github.com/idemkit/idem/internal/benchpair"
	"github.com/idemkit/idem/internal/httpharness"
	"github.com/idemkit/idem/memstore"
)

// discard is a SpanExporter that drops what it is given: the spans are
// recorded (AlwaysSample) and batched as in production, not sent.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// BenchmarkObserved: in one benchpair loop on memstore, the bare handler,
// the middleware without an Observer ("off"), with idemprom ("prom"), and
// with idemprom and idemotel ("all": an SDK tracer that samples every
// span, batching to an exporter that discards them), for first executions
// and replays of a trivial and a JSON handler. Reported: each mean, and
// the ratios prom/off and all/off; see docs/benchmarks.md.
func BenchmarkObserved(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(discard{}))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	for _, hc := range []struct {
		name string
		h    http.HandlerFunc
	}{{"trivial", httpharness.TrivialHandler}, {"json", httpharness.JSONHandler}} {
		b.Run(hc.name, func(b *testing.B) {
			prom, err := idemprom.New(prometheus.NewRegistry(), nil)
			if err != nil {
				b.Fatal(err)
			}
			all := idem.Observers(prom, idemotel.New(tp, nil))
			mw := func(o idem.Observer) http.Handler {
				m, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil), Observer: o, StoreName: "memory"})
				if err != nil {
					b.Fatal(err)
				}
				mux := http.NewServeMux()
				mux.Handle("POST /orders", m.Handler(hc.h))
				return mux
			}
			bareMux := http.NewServeMux()
			bareMux.Handle("POST /orders", hc.h)
			serveBare := httpharness.NewServe(bareMux, http.MethodPost)
			off := httpharness.NewServe(mw(nil), http.MethodPost)
			onProm := httpharness.NewServe(mw(prom), http.MethodPost)
			onAll := httpharness.NewServe(mw(all), http.MethodPost)
			for _, s := range []func([]string) *httptest.ResponseRecorder{off, onProm, onAll} {
				if w := s(httpharness.ReplayKey); w.Code != http.StatusCreated {
					b.Fatalf("priming: %d %s", w.Code, w.Body)
				}
			}
			var i int
			key := []string{""}
			next := func() { i++; key[0] = "bench-" + strconv.Itoa(i) }
			serve := func(s func([]string) *httptest.ResponseRecorder, k []string) func() {
				return func() {
					if w := s(k); w.Code != http.StatusCreated {
						b.Fatalf("status %d: %s", w.Code, w.Body)
					}
				}
			}
			// The floor of tracing: the unobserved request plus the spans
			// the tracing observer records for it (a request and its
			// store calls: three for a first execution, acquire and
			// complete; two for a replay), started and ended by hand on
			// the same SDK with as many attributes: what any tracing of
			// this request at this granularity pays, whoever records it.
			tracer := tp.Tracer("floor")
			attrs := []attribute.KeyValue{
				attribute.String("idem.kind", "store"), attribute.String("idem.op", "acquire"),
				attribute.String("idem.route", "POST /orders"), attribute.String("idem.store", "memory"),
				attribute.String("idem.outcome", "ok"), attribute.String("idem.key_hash", "0123456789abcdef"),
			}
			spans := func(n int) {
				ctx, root := tracer.Start(context.Background(), "idem.request", trace.WithAttributes(attrs...))
				for range n - 1 {
					_, sp := tracer.Start(ctx, "idem.store", trace.WithAttributes(attrs...))
					sp.End()
				}
				root.End()
			}
			firstFloor := serve(off, key)
			replayFloor := serve(off, httpharness.ReplayKey)
			b.ReportAllocs()
			m := benchpair.Run(b,
				benchpair.Func{Name: "bare", F: serve(serveBare, nil)},
				benchpair.Func{Name: "first-off", F: serve(off, key), Before: next},
				benchpair.Func{Name: "first-prom", F: serve(onProm, key), Before: next},
				benchpair.Func{Name: "first-all", F: serve(onAll, key), Before: next},
				benchpair.Func{Name: "replay-off", F: serve(off, httpharness.ReplayKey)},
				benchpair.Func{Name: "replay-prom", F: serve(onProm, httpharness.ReplayKey)},
				benchpair.Func{Name: "replay-all", F: serve(onAll, httpharness.ReplayKey)},
				benchpair.Func{Name: "first-floor", F: func() { firstFloor(); spans(3) }, Before: next},
				benchpair.Func{Name: "replay-floor", F: func() { replayFloor(); spans(2) }},
			)
			benchpair.Ratio(b, "first-prom/off", m[2], m[1])
			benchpair.Ratio(b, "first-all/off", m[3], m[1])
			benchpair.Ratio(b, "replay-prom/off", m[5], m[4])
			benchpair.Ratio(b, "replay-all/off", m[6], m[4])
			benchpair.Ratio(b, "first-all/floor", m[3], m[7])
			benchpair.Ratio(b, "replay-all/floor", m[6], m[8])
		})
	}
}
