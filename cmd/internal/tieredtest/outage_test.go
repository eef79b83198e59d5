package tieredtest_test

import (
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/tieredstore"
)

// outageTimeout bounds each Redis call. It is above the default 50 ms:
// with Redis up, 20 concurrent requests under the race detector on a
// loaded 2-core machine have seen calls take longer than 50 ms, which
// opened the circuit in the healthy phase; the stalled phase only needs
// it well under the client's own 3 s read timeout.
const (
	outageTimeout  = 300 * time.Millisecond
	outageCooldown = 200 * time.Millisecond
)

// outageEnv is a tiered store whose Redis is reached through a fault
// proxy, behind the HTTP middleware, with a handler whose effect is a row.
type outageEnv struct {
	t       *testing.T
	proxy   *netfault.Proxy
	db      *sql.DB
	truth   *countingStore
	store   tieredstore.Store
	handler http.Handler
}

// newOutageEnv builds the environment; inline sets the front client's
// ContextTimeoutEnabled, under which the store calls Redis on the
// caller's goroutine and relies on the client to end a call at the
// timeout.
func newOutageEnv(t *testing.T, inline bool) *outageEnv {
	t.Helper()
	direct := redisClient(t)
	proxy, err := netfault.New(testenv.Redis.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	// The client's own timeouts are 30 s, so that a call the store does
	// not bound would hold a request far longer than anything load can
	// explain (see testOutageStalled).
	front := redis.NewClient(&redis.Options{
		Addr:                  proxy.Addr(),
		ContextTimeoutEnabled: inline,
		ReadTimeout:           30 * time.Second,
		WriteTimeout:          30 * time.Second,
	})
	t.Cleanup(func() { _ = front.Close() })
	db, sqlStore := newTruth(t)
	truth := &countingStore{Store: sqlStore}
	store := newTiered(t, front, direct, truth, &tieredstore.Config{Timeout: outageTimeout, Cooldown: outageCooldown})
	mw, err := idemhttp.New(&idemhttp.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	effect := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		res, err := db.ExecContext(r.Context(), `INSERT INTO effects (key) VALUES (?)`, string(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		id, _ := res.LastInsertId()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"key":%q}`, id, body)
	})
	return &outageEnv{t: t, proxy: proxy, db: db, truth: truth, store: store, handler: mw.Handler(effect)}
}

type reply struct {
	code     int
	body     string
	replayed bool
	took     time.Duration
}

// round sends one POST for each key at once.
func (e *outageEnv) round(keys []string) []reply {
	out := make([]reply, len(keys))
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Go(func() {
			r := httptest.NewRequest(http.MethodPost, "/effects", strings.NewReader(key))
			r.Header.Set("Idempotency-Key", key)
			w := httptest.NewRecorder()
			start := time.Now()
			e.handler.ServeHTTP(w, r)
			out[i] = reply{w.Code, w.Body.String(), w.Header().Get(idemhttp.HeaderReplayed) == "true", time.Since(start)}
		})
	}
	wg.Wait()
	return out
}

// run sends 5 rounds of 20 keys (100 requests): the first round runs the
// effects, the others must replay them. It returns the slowest request
// and how many Acquire calls of the replay rounds reached the truth.
func (e *outageEnv) run(name string) (slowest time.Duration, truthAcquires int64) {
	e.t.Helper()
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%d", name, i)
	}
	check := func(round int, out []reply) {
		e.t.Helper()
		for _, r := range out {
			slowest = max(slowest, r.took)
			if r.code >= 500 {
				e.t.Fatalf("%s round %d: %d %s", name, round, r.code, r.body)
			}
		}
	}
	first := e.round(keys)
	check(0, first)
	for i, r := range first {
		if r.code != http.StatusCreated || r.replayed || !strings.Contains(r.body, fmt.Sprintf("%q", keys[i])) {
			e.t.Fatalf("%s first request of %s: %d replayed %v %s", name, keys[i], r.code, r.replayed, r.body)
		}
	}
	before := e.truth.acquire.Load()
	for round := 1; round < 5; round++ {
		out := e.round(keys)
		check(round, out)
		for i, r := range out {
			if r.code != http.StatusCreated || !r.replayed || r.body != first[i].body {
				e.t.Fatalf("%s round %d, %s: %d replayed %v %q; want a replay of %q", name, round, keys[i], r.code, r.replayed, r.body, first[i].body)
			}
		}
	}
	return slowest, e.truth.acquire.Load() - before
}

func (e *outageEnv) effects() int {
	e.t.Helper()
	var n int
	if err := e.db.QueryRow(`SELECT count(*) FROM effects`).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// recovered waits until the replays of name's keys are served from Redis
// again (a replay round that reaches the truth not once), or fails t.
func (e *outageEnv) recovered(name string) {
	e.t.Helper()
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%d", name, i)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		time.Sleep(outageCooldown)
		before := e.truth.acquire.Load()
		for _, r := range e.round(keys) {
			if r.code != http.StatusCreated || !r.replayed {
				e.t.Fatalf("replay after recovery: %d replayed %v %s", r.code, r.replayed, r.body)
			}
		}
		if e.truth.acquire.Load() == before {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("replays still reach the truth 10 s after Redis came back; stats %+v", e.store.Stats())
		}
	}
}

// healthy checks that, with Redis up, replays are answered by the cache
// and no Redis call fails. Under heavy load (the race detector, other
// test processes) a call can still outlast the timeout and open the
// circuit; that is what the store must do, so healthy tries again with
// new keys, up to 5 rounds, before it fails. It returns how many effects
// ran.
func (e *outageEnv) healthy() int {
	e.t.Helper()
	var last string
	for i := range 5 {
		before := e.store.Stats()
		_, n := e.run(fmt.Sprintf("warm%d", i))
		st := e.store.Stats()
		if n == 0 && st.Errors == before.Errors && st.Trips == before.Trips {
			return e.effects()
		}
		last = fmt.Sprintf("%d replays reached the truth; stats %+v", n, st)
		e.t.Logf("with Redis up, round %d: %s; again after the cooldown", i, last)
		time.Sleep(outageCooldown + 50*time.Millisecond)
	}
	e.t.Fatalf("with Redis up, 5 rounds in a row failed; the last: %s", last)
	return 0
}

// Redis refuses connections and drops the open ones: requests go on
// against SQL alone, every effect happens once, and once Redis is back the
// replays are served from it again.
func TestOutageRefused(t *testing.T) {
	forCallModes(t, testOutageRefused)
}

// forCallModes runs f with the store calling Redis on goroutines of its
// own, and inline (the client honours deadlines).
func forCallModes(t *testing.T, f func(t *testing.T, inline bool)) {
	for _, inline := range []bool{false, true} {
		name := "goroutine"
		if inline {
			name = "inline"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, inline)
		})
	}
}

func testOutageRefused(t *testing.T, inline bool) {
	e := newOutageEnv(t, inline)
	base := e.healthy()

	e.proxy.Refuse(true)
	e.proxy.Drop()
	e.run("down")
	if n := e.effects() - base; n != 20 {
		t.Fatalf("%d effects during the outage, want 20", n)
	}
	st := e.store.Stats()
	if st.Trips == 0 || st.Skipped == 0 {
		t.Fatalf("stats %+v: want the circuit opened and calls skipped", st)
	}
	t.Logf("during the outage: %+v", st)

	e.proxy.Refuse(false)
	e.recovered("down")
	e.recovered("warm0")
	if n := e.effects() - base; n != 20 {
		t.Fatalf("%d effects after recovery, want the outage's 20", n)
	}
}

// Redis stops answering (connections hang): every call is cut at
// Config.Timeout, the circuit opens, requests go on against SQL alone, and
// once Redis answers again replays are served from it.
func TestOutageStalled(t *testing.T) {
	forCallModes(t, testOutageStalled)
}

func testOutageStalled(t *testing.T, inline bool) {
	e := newOutageEnv(t, inline)
	base := e.healthy()

	e.proxy.Stall()
	start := time.Now()
	slowest, _ := e.run("stalled")
	took := time.Since(start)
	if n := e.effects() - base; n != 20 {
		t.Fatalf("%d effects while stalled, want 20", n)
	}
	st := e.store.Stats()
	if st.Trips == 0 || st.Skipped == 0 {
		t.Fatalf("stats %+v: want the circuit opened and calls skipped", st)
	}
	t.Logf("stalled: 100 requests in %v, slowest %v; %+v", took, slowest, st)
	// A call not bounded by Config.Timeout would hold its request for
	// the client's 30 s read timeout. Under load (the race detector, other
	// test processes on 2 cores) requests have taken 3 s here with every
	// call bounded, so the limit sits between the two.
	if slowest > 10*time.Second {
		t.Fatalf("slowest request took %v with Redis stalled; calls are not bounded by the timeout", slowest)
	}

	e.proxy.Resume()
	e.recovered("stalled")
	if n := e.effects() - base; n != 20 {
		t.Fatalf("%d effects after recovery, want the stall's 20", n)
	}
}
