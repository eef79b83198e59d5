package httpharness

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/benchpair"
	"github.com/idemkit/idem/memstore"
)

// CountingObserver counts the events it is told: the cheapest Observer
// that does something, the floor of any adapter's cost.
type CountingObserver struct{ Starts, Ends atomic.Int64 }

func (o *CountingObserver) Start(ctx context.Context, _ idem.Event) context.Context {
	o.Starts.Add(1)
	return ctx
}

func (o *CountingObserver) End(context.Context, idem.Event) { o.Ends.Add(1) }

// BenchObserver compares, in one benchpair loop on memstore, the
// middleware without an Observer ("off") and with obs ("on"), for first
// executions and replays of TrivialHandler and JSONHandler, and reports
// the ratio on/off of each as "<handler>-<mode>-ratio".
func BenchObserver(b *testing.B, obs idem.Observer) {
	for _, hc := range []struct {
		name string
		h    http.HandlerFunc
	}{{"trivial", TrivialHandler}, {"json", JSONHandler}} {
		b.Run(hc.name, func(b *testing.B) {
			mw := func(o idem.Observer) http.Handler {
				m, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil), Observer: o, StoreName: "memory"})
				if err != nil {
					b.Fatal(err)
				}
				mux := http.NewServeMux()
				mux.Handle("POST /orders", m.Handler(hc.h))
				return mux
			}
			off, on := NewServe(mw(nil), http.MethodPost), NewServe(mw(obs), http.MethodPost)
			for _, s := range []func([]string) *httptest.ResponseRecorder{off, on} {
				if w := s(ReplayKey); w.Code != http.StatusCreated {
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
			b.ReportAllocs()
			m := benchpair.Run(b,
				benchpair.Func{Name: "first-off", F: serve(off, key), Before: next},
				benchpair.Func{Name: "first-on", F: serve(on, key), Before: next},
				benchpair.Func{Name: "replay-off", F: serve(off, ReplayKey)},
				benchpair.Func{Name: "replay-on", F: serve(on, ReplayKey)},
			)
			b.ReportMetric(m[1]/m[0], "first-ratio")
			b.ReportMetric(m[3]/m[2], "replay-ratio")
		})
	}
}
