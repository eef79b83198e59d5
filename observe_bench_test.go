package idem_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/benchpair"
	"github.com/idemkit/idem/internal/httpharness"
	"github.com/idemkit/idem/memstore"
)

// BenchmarkGuardDoObserver compares, in one loop, Guard.Do on memstore
// without an Observer and with a counting one: first executions and
// replays. (Against the code before the observer hooks, compare
// BenchmarkGuardDoObserver's "off" means between two checkouts.)
func BenchmarkGuardDoObserver(b *testing.B) {
	ctx := context.Background()
	guard := func(o idem.Observer) *idem.Guard {
		g, err := idem.NewGuard(memstore.New(nil), &idem.GuardConfig{Observer: o, StoreName: "memory"})
		if err != nil {
			b.Fatal(err)
		}
		return g
	}
	off, on := guard(nil), guard(&httpharness.CountingObserver{})
	fp := idem.Fingerprint("v1:bench")
	work := func(context.Context) (idem.Response, error) {
		return idem.Response{StatusCode: 201, Body: []byte("ok")}, nil
	}
	var key string
	var i int
	next := func() { i++; key = "bench-" + strconv.Itoa(i) }
	do := func(g *idem.Guard, k *string, wantReplay bool) func() {
		return func() {
			if _, replayed, err := g.Do(ctx, "", *k, fp, work); err != nil || replayed != wantReplay {
				b.Fatalf("replayed %v, err %v", replayed, err)
			}
		}
	}
	replayKey := "replay"
	for _, g := range []*idem.Guard{off, on} {
		do(g, &replayKey, false)()
	}
	b.ReportAllocs()
	m := benchpair.Run(b,
		benchpair.Func{Name: "first-off", F: do(off, &key, false), Before: next},
		benchpair.Func{Name: "first-on", F: do(on, &key, false), Before: next},
		benchpair.Func{Name: "replay-off", F: do(off, &replayKey, true)},
		benchpair.Func{Name: "replay-on", F: do(on, &replayKey, true)},
	)
	b.ReportMetric(m[1]/m[0], "first-ratio")
	b.ReportMetric(m[3]/m[2], "replay-ratio")
}

// BenchmarkHashKey: what an observed operation pays per Event.KeyHash.
func BenchmarkHashKey(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = idem.HashKey("tenant-42", "order-7f3c9a2e-55b1-4c1e-9d0a-2b6f8e1d4c77")
	}
}
