package sentinelfail

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestAcknowledgedCompletionLost shows the limit of Redis' asynchronous
// replication, deterministically, and that Config.WaitReplicas closes it.
// One primary, one replica, three Sentinels. A request's effect runs;
// before its completion is stored the replica stops applying the
// replication stream (CLIENT PAUSE WRITE on the replica: the stream from
// its primary waits in its buffer). The primary is then killed: the
// replica drops what it had not applied when its link breaks, is let go,
// and the Sentinels promote it.
//
//   - plain: the primary acknowledged the completion and the client got
//     201, but the new primary lacks it (it holds the record as still
//     processing, or not at all, as the stream was held back): a retry
//     runs the effect a second time (after the lease, if processing):
//     two rows.
//   - wait: the completion is refused (ErrNotReplicated) until a replica
//     has it; the handler tries again, and the request is answered only
//     after the failover, when the new primary (and its new replica, the
//     restarted old primary) hold it. A retry replays it: one row.
func TestAcknowledgedCompletionLost(t *testing.T) {
	for _, tc := range variants {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := deploy(t, 1)
			replica := redis.NewClient(&redis.Options{Addr: d.servers[1].Addr})
			t.Cleanup(func() { _ = replica.Close() })
			pause := func(on bool) {
				t.Helper()
				cmd := []any{"client", "unpause"}
				if on {
					cmd = []any{"client", "pause", 120000, "write"}
				}
				if err := replica.Do(context.Background(), cmd...).Err(); err != nil {
					t.Error(err)
				}
			}
			// The lease must outlast the failover: while the replica is held
			// back, the watchdog's renewals are refused too (WAIT), and a
			// guard that cannot confirm its lease gives the key up. On a
			// loaded machine the Sentinels may fail over twice before they
			// settle (24.6 s once in CI, with a 10 s lease that then ran
			// out): 60 s.
			const lease = 60 * time.Second
			a := newApp(t, d, tc.wait, lease)
			var once sync.Once
			effectDone := make(chan struct{})
			a.afterEffect = func(string) {
				once.Do(func() { pause(true); close(effectDone) })
			}
			first := make(chan answer, 1)
			go func() { first <- a.post(context.Background(), "k") }()

			var ans answer
			if !tc.wait {
				ans = <-first
				if ans.status != 201 || ans.replayed {
					t.Fatalf("first request: %d replayed=%v %q %v; want 201", ans.status, ans.replayed, ans.body, ans.err)
				}
			} else {
				<-effectDone
				waitFor(t, "a completion refused for want of a replica", func() bool { return a.completeRetries.Load() > 0 })
			}
			_, took := d.failover(func(old string) {
				d.awaitLink(d.servers[1].Addr, "down")
				pause(false)
			})
			t.Logf("failover took %v", took)
			if tc.wait {
				ans = <-first
				if ans.status != 201 || ans.replayed {
					t.Fatalf("first request: %d replayed=%v %q %v; want 201 once its completion is on a replica", ans.status, ans.replayed, ans.body, ans.err)
				}
			}

			retries := a.until(t, "k")
			last := retries[len(retries)-1]
			rows := a.rows(t)["k"]
			t.Logf("first answer %q; the retry got %d answers, the last %d replayed=%v %q; effect rows %d",
				ans.body, len(retries), last.status, last.replayed, last.body, rows)
			if tc.wait {
				if !last.replayed || last.body != ans.body || rows != 1 {
					t.Fatalf("with WaitReplicas the retry must replay %q and the effect run once; got replayed=%v %q, %d rows", ans.body, last.replayed, last.body, rows)
				}
				return
			}
			// The server's limit, pinned: if this starts to fail, Redis (or
			// the test's way of holding the replica back) changed.
			if last.replayed || rows != 2 {
				t.Fatalf("plain store: want the acknowledged completion lost and the effect run twice; got replayed=%v %q, %d rows", last.replayed, last.body, rows)
			}
		})
	}
}

// waitFor polls cond until it holds, failing t after failoverTimeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(failoverTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: timed out after %v", what, failoverTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
