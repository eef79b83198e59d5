package idem_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
)

// BenchmarkGuardDo: Guard.Do on memstore with the default configuration
// (no Observer), first executions and replays; the reference for the cost
// of the observer hooks when none is set (compare between checkouts).
func BenchmarkGuardDo(b *testing.B) {
	ctx := context.Background()
	work := func(context.Context) (idem.Response, error) {
		return idem.Response{StatusCode: 201, Body: []byte("ok")}, nil
	}
	fp := idem.Fingerprint("v1:bench")
	b.Run("first", func(b *testing.B) {
		g, err := idem.NewGuard(memstore.New(nil), nil)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			if _, _, err := g.Do(ctx, "", "bench-"+strconv.Itoa(i), fp, work); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		g, err := idem.NewGuard(memstore.New(nil), nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := g.Do(ctx, "", "replay", fp, work); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, replayed, err := g.Do(ctx, "", "replay", fp, work); err != nil || !replayed {
				b.Fatal(replayed, err)
			}
		}
	})
}
