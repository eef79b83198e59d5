package killsoak_test

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/netfault"
)

// envSoak sets the duration of TestSoak's traffic (a Go duration: 10m).
// Without it the soak runs for 30 s.
const envSoak = "IDEM_SOAK"

// faultEvery is the time from the end of one fault to the start of the
// next.
const faultEvery = 3 * time.Second

// A fault is injected, held for a moment, and undone.
type fault struct {
	name   string
	inject func(r *rig) error
}

// proxyFaults are the faults of one proxy: its connections dropped (FIN)
// or reset (RST), stalled for 2 s, slowed by 40 ms each way for 3 s, new
// ones refused for 2 s (the open ones reset), and replies lost after the
// server acted for 3 s (those where lose says so).
func proxyFaults(server string, p func(*rig) []*netfault.Proxy, lose func(request []byte) bool, lost *atomic.Int64) []fault {
	each := func(r *rig, f func(*netfault.Proxy)) {
		for _, x := range p(r) {
			f(x)
		}
	}
	hold := func(d time.Duration, on, off func(*netfault.Proxy)) func(*rig) error {
		return func(r *rig) error {
			each(r, on)
			time.Sleep(d)
			each(r, off)
			return nil
		}
	}
	return []fault{
		{server + " drop", func(r *rig) error { each(r, (*netfault.Proxy).Drop); return nil }},
		{server + " reset", func(r *rig) error { each(r, (*netfault.Proxy).Reset); return nil }},
		{server + " stall 2s", hold(2*time.Second, (*netfault.Proxy).Stall, (*netfault.Proxy).Resume)},
		{server + " latency 40ms 3s", hold(3*time.Second,
			func(x *netfault.Proxy) { x.SetLatency(40 * time.Millisecond) },
			func(x *netfault.Proxy) { x.SetLatency(0) })},
		{server + " refuse 2s", hold(2*time.Second,
			func(x *netfault.Proxy) { x.Refuse(true); x.Reset() },
			func(x *netfault.Proxy) { x.Refuse(false) })},
		{server + " lost replies 3s", hold(3*time.Second,
			func(x *netfault.Proxy) {
				x.DropResponsesIf(func(req []byte) bool {
					if lose(req) {
						lost.Add(1)
						return true
					}
					return false
				})
			},
			func(x *netfault.Proxy) { x.DropResponsesIf(nil) })},
	}
}

// oneIn reports true for about one call in n.
func oneIn(n int) func([]byte) bool { return func([]byte) bool { return rand.IntN(n) == 0 } }

// soakFaults are the faults TestSoak injects, in turn: each kind of
// fault on each server's proxy in turn, and a kill after every third.
// lost counts the replies lost, by server.
func soakFaults(lost map[string]*atomic.Int64) []fault {
	for _, s := range []string{"postgres", "redis", "nats", "http"} {
		lost[s] = &atomic.Int64{}
	}
	kill := fault{"shopd SIGKILL", func(r *rig) error {
		in := r.insts[rand.IntN(len(r.insts))]
		in.kill()
		return in.start()
	}}
	servers := [][]fault{
		// PostgreSQL: a COMMIT's reply lost after the server committed.
		proxyFaults("postgres", func(r *rig) []*netfault.Proxy { return []*netfault.Proxy{r.pg} }, func(req []byte) bool {
			return bytes.Contains(bytes.ToLower(req), []byte("commit")) && rand.IntN(3) == 0
		}, lost["postgres"]),
		proxyFaults("redis", func(r *rig) []*netfault.Proxy { return []*netfault.Proxy{r.redis} }, oneIn(3), lost["redis"]),
		proxyFaults("nats", func(r *rig) []*netfault.Proxy { return []*netfault.Proxy{r.broker} }, oneIn(5), lost["nats"]),
		// Clients to shopd: the answer to a POST lost after shopd
		// handled it.
		proxyFaults("http", func(r *rig) []*netfault.Proxy { return r.front }, func(req []byte) bool {
			rq, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(req)))
			return err == nil && rq.Method == http.MethodPost && rand.IntN(3) == 0
		}, lost["http"]),
	}
	var out []fault
	for kind := range servers[0] {
		for _, fs := range servers {
			out = append(out, fs[kind])
			if len(out)%4 == 3 {
				out = append(out, kill)
			}
		}
	}
	return out
}

// TestSoak: the rig of TestKillLoop behind netfault proxies (shopd to
// PostgreSQL, Redis and NATS; the clients to each shopd), scenarios
// started at a fixed rate, and a fault every few seconds, in turn: a
// SIGKILL of an instance, or one proxy's connections dropped, reset,
// stalled, slowed, refused, or their replies lost after the server
// acted (a COMMIT's reply, a Redis script's, a NATS ack, an HTTP answer).
// At the end, the invariants of TestKillLoop, and the figures.
// IDEM_SOAK=10m soaks for ten minutes.
func TestSoak(t *testing.T) {
	t.Parallel()
	duration, rate := 30*time.Second, 4.0
	if v := os.Getenv(envSoak); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a duration such as 10m", envSoak, v)
		}
		duration, rate = d, 6
	}
	r := newRig(t, 2, true)
	fig := &figures{}
	tr := newTraffic(r.bases(), fig)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var started, skipped int64
	wg.Go(func() { started, skipped = tr.runRate(rate, 200, 400, stop) })
	start := time.Now()
	lost := map[string]*atomic.Int64{}
	faults := soakFaults(lost)
	first := rand.IntN(len(faults)) // a short run covers other faults each time
	injected := map[string]int{}
	var faultErr error
	for i := first; time.Since(start) < duration; i++ {
		time.Sleep(faultEvery)
		f := faults[i%len(faults)]
		injected[f.name]++
		if faultErr = f.inject(r); faultErr != nil {
			break
		}
	}
	close(stop)
	wg.Wait()
	if faultErr != nil {
		t.Fatal(faultErr)
	}
	traffic := time.Since(start)
	settled := r.settle(t)
	e := r.check(t, tr.led)

	var kinds []string
	total := 0
	for k, n := range injected {
		kinds = append(kinds, fmt.Sprintf("%s ×%d", k, n))
		total += n
	}
	sort.Strings(kinds)
	t.Logf("%v of traffic at %.0f scenarios/s (%d started, %d skipped at 400 in flight); settled in %v", traffic.Round(time.Second), rate, started, skipped, settled.Round(time.Second))
	t.Logf("%d faults: %s", total, strings.Join(kinds, ", "))
	t.Logf("replies lost after the server acted: %d COMMITs of PostgreSQL, %d of Redis, %d of NATS, %d HTTP answers",
		lost["postgres"].Load(), lost["redis"].Load(), lost["nats"].Load(), lost["http"].Load())
	t.Logf("clients: %v", fig)
	t.Logf("operations: %v", tr.led.ops)
	t.Logf("database: %v", e)
	if fig.gaveUp.Load() > 0 {
		t.Errorf("%d requests got no final answer within %v", fig.gaveUp.Load(), tr.lb.patience)
	}
	if e.orders == 0 || e.byStatus["PAID"]+e.byStatus["REFUNDED"] == 0 || e.refunds == 0 {
		t.Errorf("the traffic did too little to prove anything: %v", e)
	}
}
