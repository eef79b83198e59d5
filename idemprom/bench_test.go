package idemprom_test

import (
	"testing"

	"github.com/idemkit/idem/idemprom"
	"github.com/idemkit/idem/internal/httpharness"
	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkMiddleware: idemhttp's middleware on memstore with the
// Prometheus Observer against none, in one loop (first executions and
// replays, for a trivial and a JSON handler); see docs/benchmarks.md.
func BenchmarkMiddleware(b *testing.B) {
	obs, err := idemprom.New(prometheus.NewRegistry(), nil)
	if err != nil {
		b.Fatal(err)
	}
	httpharness.BenchObserver(b, obs)
}
