// Package throughput measures how many operations per second many
// concurrent clients get from a store, for the stores' benchmarks.
package throughput

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
)

// Clients is the number of concurrent clients Run simulates.
const Clients = 64

// seq numbers operations across every Run of the process, so that
// operations on new keys never repeat a key.
var seq atomic.Int64

// Run runs op on Clients goroutines (Clients / GOMAXPROCS per processor,
// at least one) until b.N operations are done, and reports operations per
// second as "ops/s". op receives a number unique within the process.
func Run(b *testing.B, op func(ctx context.Context, n int64) error) {
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(max(1, Clients/runtime.GOMAXPROCS(0)))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := op(ctx, seq.Add(1)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// Next returns a number unique within the process, for keys made outside
// Run.
func Next() int64 { return seq.Add(1) }
