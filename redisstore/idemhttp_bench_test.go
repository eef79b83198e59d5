package redisstore_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/benchpair"
	"github.com/idemkit/idem/internal/httpharness"
)

// The idemhttp middleware end to end on the store, with idemhttp's
// benchmark drivers (internal/httpharness).

// BenchmarkRedis runs the json handler bare and behind the middleware on
// redisstore (first execution, replay), with a Redis PING in the same
// run. first and replay report their cost over the bare handler
// (over-bare-ns) and the margin to the target (margin-ns, negative when
// missed): a first execution within 2 round trips + 20 µs of the bare
// handler, a replay within 1 round trip + 20 µs, a round trip being the
// PING of the same run.
//
// The sub-benchmarks run one after the other, so the round trip may
// have drifted between them; BenchmarkRedisInterleaved measures the
// same in one loop.
//
//	go test -run '^$' -bench Redis -benchmem -count 3 ./redisstore/
func BenchmarkRedis(b *testing.B) {
	c := singleClient(b)
	mw := func(b *testing.B) http.Handler { return redisMiddleware(b, c) }
	// The last (longest) run of a sub-benchmark leaves its ns/op here.
	var pingNS, bareNS float64
	nsPerOp := func(b *testing.B) float64 { return float64(b.Elapsed().Nanoseconds()) / float64(b.N) }
	b.Run("ping", func(b *testing.B) {
		b.ReportAllocs()
		ctx := b.Context()
		for b.Loop() {
			if err := c.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
		}
		pingNS = nsPerOp(b)
	})
	b.Run("json/bare-post", func(b *testing.B) {
		httpharness.BenchServe(b, http.HandlerFunc(httpharness.JSONHandler), http.MethodPost, httpharness.NoKey, 201)
		bareNS = nsPerOp(b)
	})
	target := func(b *testing.B, roundTrips float64) {
		over := nsPerOp(b) - bareNS
		b.ReportMetric(over, "over-bare-ns")
		b.ReportMetric(roundTrips*pingNS+float64(20*time.Microsecond)-over, "margin-ns")
	}
	b.Run("json/first", func(b *testing.B) {
		httpharness.BenchServe(b, mw(b), http.MethodPost, httpharness.NewKey, 201)
		target(b, 2)
	})
	b.Run("json/replay", func(b *testing.B) {
		httpharness.BenchServe(b, mw(b), http.MethodPost, httpharness.SameKey, 201)
		target(b, 1)
	})
}

// BenchmarkRedisInterleaved measures what BenchmarkRedis does, in one
// loop (benchpair.Run): each iteration serves the json handler bare, sends
// a PING on the middleware's Redis client, serves a first execution (new
// key) and a replay (completed key) through the middleware. It reports
// the means as "<name>-ns" and the cost over budget of the first
// execution (first − (bare + 2 pings + 20 µs)) and of the replay
// (replay − (bare + 1 ping + 20 µs)) as first-over-budget-ns and
// replay-over-budget-ns: negative means within budget. The benchmark's
// ns/op and allocs are those of the whole iteration.
//
//	go test -run '^$' -bench RedisInterleaved -benchmem -benchtime 2000x -count 3 ./redisstore/
func BenchmarkRedisInterleaved(b *testing.B) {
	c := singleClient(b)
	ctx := b.Context()
	bare := httpharness.NewServe(http.HandlerFunc(httpharness.JSONHandler), http.MethodPost)
	first := httpharness.NewServe(redisMiddleware(b, c), http.MethodPost)
	replay := httpharness.NewServe(redisMiddleware(b, c), http.MethodPost)
	if w := replay(httpharness.ReplayKey); w.Code != 201 {
		b.Fatalf("priming: status %d: %s", w.Code, w.Body)
	}
	check := func(w *httptest.ResponseRecorder) {
		if w.Code != 201 {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
	var (
		n   int
		key []string
	)
	b.ReportAllocs()
	m := benchpair.Run(b,
		benchpair.Func{Name: "bare", F: func() { check(bare(nil)) }},
		benchpair.Func{Name: "ping", F: func() {
			if err := c.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
		}},
		benchpair.Func{
			Name: "first",
			Before: func() {
				n++
				key = []string{"bench-" + strconv.Itoa(n)}
			},
			F: func() { check(first(key)) },
		},
		benchpair.Func{Name: "replay", F: func() { check(replay(nil)) }},
	)
	bareNS, pingNS, firstNS, replayNS := m[0], m[1], m[2], m[3]
	budget := float64(20 * time.Microsecond)
	b.ReportMetric(firstNS-(bareNS+2*pingNS+budget), "first-over-budget-ns")
	b.ReportMetric(replayNS-(bareNS+pingNS+budget), "replay-over-budget-ns")
}

// redisMiddleware returns httpharness.JSONHandler behind the middleware
// on a redisstore of c with a prefix of its own (newStore), whose keys are
// deleted when b ends.
func redisMiddleware(b *testing.B, c *redis.Client) http.Handler {
	b.Helper()
	m, err := idemhttp.New(&idemhttp.Config{Store: newStore(b, c, nil)})
	if err != nil {
		b.Fatal(err)
	}
	return m.Handler(http.HandlerFunc(httpharness.JSONHandler))
}
