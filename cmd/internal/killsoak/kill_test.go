package killsoak_test

import (
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// envKillRounds sets the number of kills of TestKillLoop (default 4).
const envKillRounds = "IDEM_KILL_ROUNDS"

// killEvery is the time between two kills.
const killEvery = 6 * time.Second

// TestKillLoop: two shopd processes on one PostgreSQL database, Redis in
// front and NATS as the broker, under mixed traffic from 12 clients
// (96 users) whose client moves to the other instance when one does not answer; one
// instance is killed with SIGKILL every 6 s, alternating, and started
// again on its port at once. When the traffic has stopped and the shop
// has settled, every invariant holds in the database.
func TestKillLoop(t *testing.T) {
	t.Parallel()
	rounds := 4
	if v := os.Getenv(envKillRounds); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", envKillRounds, v)
		}
		rounds = n
	}
	r := newRig(t, 2, false)
	fig := &figures{}
	tr := newTraffic(r.bases(), fig)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { tr.runWorkers(12, stop) })
	start := time.Now()
	var restarts []time.Duration
	for i := range rounds {
		time.Sleep(killEvery)
		in := r.insts[i%len(r.insts)]
		in.kill()
		killed := time.Now()
		if err := in.start(); err != nil {
			close(stop)
			wg.Wait()
			t.Fatal(err)
		}
		restarts = append(restarts, time.Since(killed))
	}
	// Traffic goes on a little after the last kill, then stops; the
	// requests in flight finish.
	time.Sleep(killEvery)
	close(stop)
	wg.Wait()
	traffic := time.Since(start)
	settled := r.settle(t)
	e := r.check(t, tr.led)

	slices.Sort(restarts)
	t.Logf("%d kills in %v of traffic (listening again %v to %v after the kill, median %v); settled in %v", rounds, traffic.Round(time.Second),
		restarts[0].Round(time.Millisecond), restarts[len(restarts)-1].Round(time.Millisecond), restarts[len(restarts)/2].Round(time.Millisecond), settled.Round(time.Second))
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
