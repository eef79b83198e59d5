//go:build linux

package pgfailover

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/netfault"
)

// TestAsyncFailoverLosesAcknowledged shows where idem's guarantee stops:
// with asynchronous replication, a commit the primary acknowledged may be
// missing on the replica promoted after the primary's death. The replica
// streams through a proxy that the test stalls, so it is behind by
// exactly one request when the primary is killed: that request was
// answered 201, and on the promoted server its record and its effect row
// are both gone, so its retry runs the handler again. The keys answered
// while the replica kept up are there, once each.
func TestAsyncFailoverLosesAcknowledged(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	primary := c.initPrimary(0)
	proxy, err := netfault.New(primary.addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	replica := c.startReplica(1, proxy.Addr())
	c.waitStreaming(primary, replica) // asynchronous: synchronous_standby_names = ''
	rg := newRig(t, c.url())
	var ty tally
	ctx, cancel := context.WithTimeout(context.Background(), keyWait)
	defer cancel()

	// Keys answered while the replica keeps up.
	kept := map[string]reply{}
	for i := range 20 {
		key := fmt.Sprintf("kept-%02d", i)
		rp, err := rg.untilAnswered(ctx, key, &ty)
		if err != nil {
			t.Fatal(err)
		}
		kept[key] = rp
	}
	var lsn string
	if err := primary.admin.QueryRowContext(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	replica.waitFor("the replica to replay the kept keys", func(ctx context.Context) (bool, error) {
		var done bool
		err := replica.admin.QueryRowContext(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, lsn).Scan(&done)
		return done, err
	})

	// The replica falls behind; the primary acknowledges one more request.
	proxy.Stall()
	const lostKey = "acknowledged-then-lost"
	first, err := rg.untilAnswered(ctx, lostKey, &ty)
	if err != nil {
		t.Fatal(err)
	}
	if first.status != http.StatusCreated || first.replayed {
		t.Fatalf("%s: %d %s (replayed %v), want a first 201", lostKey, first.status, first.body, first.replayed)
	}
	if n := len(effects(t, primary)[lostKey]); n != 1 {
		t.Fatalf("%s: %d effect rows on the primary after its 201, want 1", lostKey, n)
	}
	if n := len(effects(t, replica)[lostKey]); n != 0 {
		t.Fatalf("%s: %d effect rows on the stalled replica, want 0: it did not fall behind", lostKey, n)
	}

	primary.kill()
	replica.promote()

	// The acknowledged completion is gone: no record, no effect row.
	rows := effects(t, replica)
	if ids := rows[lostKey]; len(ids) != 0 {
		t.Fatalf("%s: effect rows %v on the promoted server: the replica was not behind", lostKey, ids)
	}
	if rec, err := get(ctx, rg, lostKey); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("%s: Get on the promoted server = %+v, %v; want idem.ErrNotFound", lostKey, rec, err)
	}
	// What was replicated is there, once each, and replays as answered.
	for key, want := range kept {
		if ids := rows[key]; len(ids) != 1 || ids[0] != effectOf(t, want.body) {
			t.Errorf("kept key %s: effect rows %v, want the one its answer %s names", key, ids, want.body)
		}
		rp, err := rg.untilAnswered(ctx, key, &ty)
		if err != nil || rp.body != want.body || !rp.replayed {
			t.Errorf("kept key %s: replay %d %s (replayed %v), %v; its client got %s", key, rp.status, rp.body, rp.replayed, err, want.body)
		}
	}

	// A retry of the acknowledged request runs the handler a second time:
	// an effect outside the database (a charge, an email) would happen
	// twice.
	retryStart := time.Now()
	again, err := rg.untilAnswered(ctx, lostKey, &ty)
	if err != nil {
		t.Fatal(err)
	}
	if again.replayed || again.status != http.StatusCreated {
		t.Errorf("%s: retry answered %d %s (replayed %v), want the handler's own 201", lostKey, again.status, again.body, again.replayed)
	}
	if n := rg.ran(lostKey); n != 2 {
		t.Errorf("%s: the handler ran %d times, want 2 (once on each primary)", lostKey, n)
	}
	if ids := effects(t, replica)[lostKey]; len(ids) != 1 || ids[0] != effectOf(t, again.body) {
		t.Errorf("%s: effect rows %v on the promoted server after the retry, want the one %s names", lostKey, ids, again.body)
	}
	t.Logf("acknowledged %s (%s) lost with the old primary; the retry ran the handler again in %v and answered %s; %d kept keys intact; clients: %s",
		lostKey, first.body, time.Since(retryStart).Round(time.Millisecond), again.body, len(kept), &ty)
}

// get reads key's record, again while the pool still hands out
// connections to the dead primary (an error other than idem.ErrNotFound).
func get(ctx context.Context, rg *rig, key string) (idem.Record, error) {
	for {
		rec, err := rg.store.Get(ctx, "", key)
		if err == nil || errors.Is(err, idem.ErrNotFound) || ctx.Err() != nil {
			return rec, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
