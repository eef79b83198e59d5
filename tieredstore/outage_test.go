package tieredstore_test

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
	store   *tieredstore.Store
	handler http.Handler
}

func newOutageEnv(t *testing.T) *outageEnv {
	t.Helper()
	direct := redisClient(t)
	proxy, err := netfault.New(testenv.Redis.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	// The client's defaults (no ContextTimeoutEnabled, 3 retries, 3 s read
	// timeout): the store must bound its calls by itself.
	front := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
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

func (e *outageEnv) healthy() {
	e.t.Helper()
	if _, n := e.run("warm"); n != 0 {
		e.t.Fatalf("with Redis up, %d replays reached the truth; want 0", n)
	}
	if st := e.store.Stats(); st.Errors != 0 || st.Trips != 0 {
		e.t.Fatalf("with Redis up: stats %+v", st)
	}
}

// Redis refuses connections and drops the open ones: requests go on
// against SQL alone, every effect happens once, and once Redis is back the
// replays are served from it again.
func TestOutageRefused(t *testing.T) {
	t.Parallel()
	e := newOutageEnv(t)
	e.healthy()

	e.proxy.Refuse(true)
	e.proxy.Drop()
	e.run("down")
	if n := e.effects(); n != 40 {
		t.Fatalf("%d effects, want 40 (20 before, 20 during the outage)", n)
	}
	st := e.store.Stats()
	if st.Trips == 0 || st.Skipped == 0 {
		t.Fatalf("stats %+v: want the circuit opened and calls skipped", st)
	}
	t.Logf("during the outage: %+v", st)

	e.proxy.Refuse(false)
	e.recovered("down")
	e.recovered("warm")
	if n := e.effects(); n != 40 {
		t.Fatalf("%d effects after recovery, want 40", n)
	}
}

// Redis stops answering (connections hang): every call is cut at
// Config.Timeout, the circuit opens, requests go on against SQL alone, and
// once Redis answers again replays are served from it.
func TestOutageStalled(t *testing.T) {
	t.Parallel()
	e := newOutageEnv(t)
	e.healthy()

	e.proxy.Stall()
	start := time.Now()
	slowest, _ := e.run("stalled")
	took := time.Since(start)
	if n := e.effects(); n != 40 {
		t.Fatalf("%d effects, want 40", n)
	}
	st := e.store.Stats()
	if st.Trips == 0 || st.Skipped == 0 {
		t.Fatalf("stats %+v: want the circuit opened and calls skipped", st)
	}
	t.Logf("stalled: 100 requests in %v, slowest %v; %+v", took, slowest, st)
	// Loose: the client's own read timeout is 3 s; a call not bounded by
	// Config.Timeout (outageTimeout) would hold a request that long.
	if slowest > 2*time.Second {
		t.Fatalf("slowest request took %v with Redis stalled; calls are not bounded by the timeout", slowest)
	}

	e.proxy.Resume()
	e.recovered("stalled")
	if n := e.effects(); n != 40 {
		t.Fatalf("%d effects after recovery, want 40", n)
	}
}
