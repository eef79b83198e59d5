package idemhttp_test

import (
	"context"
	"crypto/rand"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/redisstore"
)

// BenchmarkRedis runs the json handler bare and behind the middleware on
// redisstore (first execution, replay), with a Redis PING in the same
// run. first and replay report their cost over the bare handler
// (over-bare-ns) and the margin to the target (margin-ns, negative when
// missed): a first execution within 2 round trips + 20 µs of the bare
// handler, a replay within 1 round trip + 20 µs, a round trip being the
// PING of the same run.
//
//	go test -run '^$' -bench Redis -benchmem -count 3 ./idemhttp/
func BenchmarkRedis(b *testing.B) {
	addr := testenv.Redis.Need(b)
	c := redis.NewClient(&redis.Options{Addr: addr})
	b.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(b.Context()).Err(); err != nil {
		testenv.Unavailable(b, testenv.Redis.Name, testenv.Redis.Var, err)
	}
	mw := func(b *testing.B) http.Handler {
		prefix := "idembench-" + strings.ToLower(rand.Text()[:12])
		s, err := redisstore.New(c, &redisstore.Config{Prefix: prefix})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { deleteRedisPrefix(b, c, prefix) })
		m, err := idemhttp.New(&idemhttp.Config{Store: s})
		if err != nil {
			b.Fatal(err)
		}
		return m.Handler(http.HandlerFunc(jsonHandler))
	}
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
		benchServe(b, http.HandlerFunc(jsonHandler), http.MethodPost, noKey, 201)
		bareNS = nsPerOp(b)
	})
	target := func(b *testing.B, roundTrips float64) {
		over := nsPerOp(b) - bareNS
		b.ReportMetric(over, "over-bare-ns")
		b.ReportMetric(roundTrips*pingNS+float64(20*time.Microsecond)-over, "margin-ns")
	}
	b.Run("json/first", func(b *testing.B) {
		benchServe(b, mw(b), http.MethodPost, newKey, 201)
		target(b, 2)
	})
	b.Run("json/replay", func(b *testing.B) {
		benchServe(b, mw(b), http.MethodPost, sameKey, 201)
		target(b, 1)
	})
}

// deleteRedisPrefix deletes every key of prefix (never anything else).
func deleteRedisPrefix(b *testing.B, c *redis.Client, prefix string) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	p := c.Pipeline()
	for iter.Next(ctx) {
		p.Unlink(ctx, iter.Val())
		if p.Len() >= 1000 {
			if _, err := p.Exec(ctx); err != nil {
				b.Errorf("cleanup: %v", err)
				return
			}
		}
	}
	if err := iter.Err(); err != nil {
		b.Errorf("cleanup: SCAN %s:*: %v", prefix, err)
	}
	if _, err := p.Exec(ctx); err != nil {
		b.Errorf("cleanup: %v", err)
	}
}
