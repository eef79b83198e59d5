package idemcli

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/benchpair"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/redisstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

// roundTrips counts the commands a go-redis client sends: one per
// command, one per pipeline.
type roundTrips struct{ n atomic.Int64 }

func (c *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}

// BenchmarkProxy measures idem proxy against a bare httputil.ReverseProxy
// in front of the same upstream, interleaved in one loop
// (internal/benchpair): a first request (new key: acquire, upstream,
// complete), a replay, and a request through the bare proxy. On Redis it
// also reports the store's round trips per first request.
func BenchmarkProxy(b *testing.B) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"ord_1","status":"created","total":4200}`)
	}))
	defer upstream.Close()
	up, _ := url.Parse(upstream.URL)

	b.Run("SQLite", func(b *testing.B) {
		st, err := storeFlags{name: "store", raw: "sqlite:" + filepath.Join(b.TempDir(), "idem.db")}.open(context.Background(), openOptions{migrate: true})
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		// The floor: what any store that makes a first request durable
		// on this disk pays at least, whatever its code. A first request
		// writes twice (the record before the upstream call, the answer
		// after it), each commit synced before the proxy goes on; the
		// floor is the bare request plus two such commits of one small
		// row, on a SQLite file opened like the store's.
		fdb, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "floor.db"))
		if err != nil {
			b.Fatal(err)
		}
		defer fdb.Close()
		if _, err := fdb.Exec(`CREATE TABLE floor (k TEXT PRIMARY KEY, v TEXT)`); err != nil {
			b.Fatal(err)
		}
		var fn int64
		commits := func() {
			fn++
			k := strconv.FormatInt(fn, 10)
			if _, err := fdb.Exec(`INSERT INTO floor (k, v) VALUES (?, 'processing')`, k); err != nil {
				b.Fatal(err)
			}
			if _, err := fdb.Exec(`UPDATE floor SET v = 'completed' WHERE k = ?`, k); err != nil {
				b.Fatal(err)
			}
		}
		benchProxy(b, up, st.store, nil, commits)
	})
	b.Run("Redis", func(b *testing.B) {
		addr := testenv.Redis.Need(b)
		counter := &roundTrips{}
		rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		defer rdb.Close()
		if err := rdb.Ping(context.Background()).Err(); err != nil {
			testenv.Unavailable(b, testenv.Redis.Name, testenv.Redis.Var, err)
		}
		rs, err := redisstore.New(rdb, &redisstore.Config{Prefix: "idem-proxy-bench"})
		if err != nil {
			b.Fatal(err)
		}
		rdb.AddHook(counter)
		benchProxy(b, up, rs, counter, nil)
	})
}

// benchProxy runs the three requests, and with floor a fourth: the bare
// request followed by floor (the store's unavoidable writes).
func benchProxy(b *testing.B, up *url.URL, store idem.Store, counter *roundTrips, floor func()) {
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	p := newProxyFlags(fs)
	if err := fs.Parse([]string{"-upstream", up.String()}); err != nil {
		b.Fatal(err)
	}
	px, err := newProxy(p, up, nil, store, "", nil, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	defer px.transport.CloseIdleConnections()
	guarded := httptest.NewServer(px)
	defer guarded.Close()
	bare := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(up)
		pr.SetXForwarded()
	}})
	defer bare.Close()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DialContext: (&net.Dialer{}).DialContext}}
	defer client.CloseIdleConnections()
	const body = `{"sku":"BOOK-1","quantity":2,"address":{"street":"1 Main St","city":"Springfield"}}`
	post := func(base, key string) {
		req, _ := http.NewRequest(http.MethodPost, base+"/orders", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	prefix := newKey("bench")
	var n, before, trips, firsts int64
	key := ""
	funcs := []benchpair.Func{
		{Name: "first", Before: func() {
			n++
			key = prefix + "-" + strconv.FormatInt(n, 10)
			if counter != nil {
				before = counter.n.Load()
			}
		}, F: func() {
			post(guarded.URL, key)
			if counter != nil {
				trips += counter.n.Load() - before
				firsts++
			}
		}},
		{Name: "replay", F: func() { post(guarded.URL, prefix+"-replayed") }},
		{Name: "bare", F: func() { post(bare.URL, "") }},
	}
	if floor != nil {
		funcs = append(funcs, benchpair.Func{Name: "floor", F: func() { post(bare.URL, ""); floor() }})
	}
	means := benchpair.Run(b, funcs...)
	benchpair.Ratio(b, "x-bare-first", means[0], means[2])
	benchpair.Ratio(b, "x-bare-replay", means[1], means[2])
	if floor != nil {
		benchpair.Ratio(b, "x-floor-first", means[0], means[3])
		benchpair.Ratio(b, "x-bare-floor", means[3], means[2])
	}
	if firsts > 0 {
		b.ReportMetric(float64(trips)/float64(firsts), "store-trips/first")
	}
}
