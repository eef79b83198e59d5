//go:build linux

package pgfailover

import (
	"bytes"
	"context"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/internal/netfault"
)

// commitQuery is the message pgx sends for tx.Commit: a simple query
// ('Q', its length, "commit" and a NUL).
var commitQuery = append([]byte{'Q', 0, 0, 0, 11}, "commit\x00"...)

// TestSyncFailoverKeepsUnsureCommit is the other side of the synchronous
// guarantee, made to happen every run rather than by chance under load:
// the primary commits a request (so its replica has written it) and dies
// before its answer to COMMIT reaches the program. The handler sees its
// commit fail and answers 500; the middleware cannot read whether the
// completion committed (no server accepts writes), so the client gets
// that 500. On the promoted server the record is completed with the
// effect: the client's retry gets the answer the handler could not send,
// replayed, and the handler does not run again.
func TestSyncFailoverKeepsUnsureCommit(t *testing.T) {
	t.Parallel()
	_, primary, replica := syncPair(t)
	// The program reaches the primary through a proxy that, when the
	// primary answers a COMMIT, kills it before the answer goes on.
	proxy, err := netfault.New(primary.addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	rg := newRig(t, multiHost(proxy.Addr(), replica.addr()))
	ctx, cancel := context.WithTimeout(context.Background(), keyWait)
	defer cancel()
	var ty tally
	if _, err := rg.untilAnswered(ctx, "before", &ty); err != nil {
		t.Fatal(err)
	}

	var dropped atomic.Bool
	proxy.DropResponsesIf(func(request []byte) bool {
		if !bytes.Contains(request, commitQuery) || !dropped.CompareAndSwap(false, true) {
			return false
		}
		primary.kill()
		return true
	})
	const key = "committed-unacknowledged"
	first, err := rg.post(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	proxy.DropResponsesIf(nil)
	rg.mu.Lock()
	unsure := slices.Clone(rg.unsure[key])
	rg.mu.Unlock()
	if first.status != http.StatusInternalServerError || len(unsure) != 1 {
		t.Fatalf("%s: %d %s with unsure commits %v; want the handler's 500 after the primary died with its commit's answer", key, first.status, first.body, unsure)
	}
	replica.promote()

	again, err := rg.untilAnswered(ctx, key, &ty)
	if err != nil {
		t.Fatal(err)
	}
	if !again.replayed || again.status != http.StatusCreated || effectOf(t, again.body) != unsure[0] {
		t.Errorf("%s: retry answered %d %s (replayed %v), want the replay of effect %d", key, again.status, again.body, again.replayed, unsure[0])
	}
	if n := rg.ran(key); n != 1 {
		t.Errorf("%s: the handler ran %d times, want 1", key, n)
	}
	if ids := effects(t, replica)[key]; !slices.Equal(ids, unsure) {
		t.Errorf("%s: effect rows %v on the promoted server, want %v", key, ids, unsure)
	}
	t.Logf("%s: answered %d as the primary died with its commit's answer; after the failover the retry replayed %s; clients: %s",
		key, first.status, again.body, &ty)
}
