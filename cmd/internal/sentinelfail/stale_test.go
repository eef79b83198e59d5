package sentinelfail

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/internal/redisproc"
)

// TestStaleSentinel shows what go-redis' failover client does with a
// Sentinel that names a replica as the primary (as a Sentinel split by
// two failovers in a row does; see settle): it asks that one Sentinel,
// dials the replica, and every write fails READONLY, again and again,
// while the deployment's own Sentinels name the primary. The guard
// answers 503 and runs no effect; the same program on the deployment's
// Sentinels answers 201.
func TestStaleSentinel(t *testing.T) {
	t.Parallel()
	d := deploy(t, 1)
	replica := d.servers[1]
	// A Sentinel of its own monitoring the replica as the primary: the
	// deployment's Sentinels' hellos carry configuration epoch 0, not
	// newer than its own, so it keeps naming the replica.
	conf := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d 2\n"+
		"sentinel down-after-milliseconds %[1]s 1000\n", masterName, replica.Port)
	stale := &deployment{t: t, sentinels: []*redisproc.Server{
		redisproc.Start(t, redisproc.Options{Conf: conf, Args: []string{"--sentinel"}}),
	}}

	rc := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: masterName, SentinelAddrs: stale.addrs(), ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = rc.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), failoverTimeout)
	defer cancel()
	err := rc.Set(ctx, "stale", "x", 0).Err()
	if !redis.IsReadOnlyError(err) {
		t.Fatalf("SET through the stale Sentinel: %v; want READONLY", err)
	}

	a := newApp(t, stale, false, 10*time.Second)
	for i := range 5 {
		ans := a.post(t.Context(), "k")
		if ans.err != nil || ans.status != http.StatusServiceUnavailable {
			t.Fatalf("request %d through the stale Sentinel: %d %q %v; want 503", i, ans.status, ans.body, ans.err)
		}
	}
	if n := a.rows(t)["k"]; n != 0 {
		t.Fatalf("%d effect rows for a key the store refused; want none", n)
	}
	// Meanwhile the deployment's Sentinels name the primary, and the
	// same program on them runs the effect once.
	good := newApp(t, d, false, 10*time.Second)
	if got := good.until(t, "k"); !got[len(got)-1].ok() || good.rows(t)["k"] != 1 {
		t.Fatalf("through the deployment's Sentinels: %+v, %d rows; want 201 and one row", got[len(got)-1], good.rows(t)["k"])
	}
}
