package storetest

import (
	"fmt"

	"github.com/idemkit/idem"
)

type acquireOutcome struct {
	res idem.AcquireResult
	err error
}

// raceAcquire runs n Acquire calls at once; req(i) is the i-th request.
func (h *harness) raceAcquire(n int, req func(i int) idem.AcquireRequest) []acquireOutcome {
	h.Helper()
	out := race(n, func(i int) acquireOutcome {
		res, err := h.store.Acquire(h.ctx, req(i))
		return acquireOutcome{res, err}
	})
	for i, o := range out {
		if o.err != nil {
			h.Fatalf("racing Acquire %d: %v", i, o.err)
		}
	}
	return out
}

// onlyWinner fails the case unless exactly one of out is Acquired with the
// fence want and every other is InFlight on the winner's record. It
// returns the winner's lease.
func (h *harness) onlyWinner(out []acquireOutcome, fence int64, tookOver bool) idem.Lease {
	h.Helper()
	var (
		winners []idem.Lease
		counts  = map[idem.Outcome]int{}
	)
	for _, o := range out {
		counts[o.res.Outcome]++
		if o.res.Outcome == idem.Acquired {
			winners = append(winners, o.res.Lease)
			if o.res.TookOver != tookOver {
				h.Errorf("winner's TookOver = %v, want %v", o.res.TookOver, tookOver)
			}
		}
	}
	if len(winners) != 1 || counts[idem.InFlight] != len(out)-1 {
		h.Fatalf("%d racing Acquire calls: %v; want exactly 1 acquired and %d in-flight", len(out), counts, len(out)-1)
	}
	w := winners[0]
	if w.Fence != fence {
		h.Fatalf("winner's fence = %d, want %d", w.Fence, fence)
	}
	for _, o := range out {
		if o.res.Outcome == idem.InFlight && (o.res.Record.Owner != w.Owner || o.res.Record.Fence != w.Fence) {
			h.Fatalf("an in-flight answer shows owner/fence %q/%d, not the winner's %q/%d", o.res.Record.Owner, o.res.Record.Fence, w.Owner, w.Fence)
		}
	}
	rec := h.get(w.Key)
	if rec.Owner != w.Owner || rec.Fence != w.Fence || rec.Status != idem.StatusProcessing {
		h.Fatalf("after the race the record is %s, want the winner's (owner %q, fence %d)", fmtRecord(rec), w.Owner, w.Fence)
	}
	return w
}

var raceCases = []testCase{
	{name: "RaceNewKey", run: func(h *harness) {
		req := h.req("k", "fp", longLease)
		w := h.onlyWinner(h.raceAcquire(200, func(int) idem.AcquireRequest { return req }), 1, false)
		resp := idem.Response{StatusCode: 200, Body: []byte("once")}
		h.complete(w, resp)
		h.checkCompleted(h.get("k"), "fp", w, resp, longRetention)
	}},

	{name: "RaceTakeover", run: func(h *harness) {
		req := h.req("k", "fp", shortLease)
		stale := h.lease(req)
		h.sleepPast(shortLease)
		req.Lease = longLease
		w := h.onlyWinner(h.raceAcquire(100, func(int) idem.AcquireRequest { return req }), stale.Fence+1, true)
		h.leaseLost("stale Complete", h.store.Complete(h.ctx, stale, idem.Response{}, longRetention))
		h.complete(w, idem.Response{StatusCode: 200})
	}},

	{name: "RaceReplaceExpiredCompleted", run: func(h *harness) {
		old := h.lease(h.req("k", "fp", longLease))
		if err := h.store.Complete(h.ctx, old, idem.Response{StatusCode: 200}, shortRetention); err != nil {
			h.Fatalf("Complete: %v", err)
		}
		h.sleepPast(shortRetention)
		req := h.req("k", "fp", longLease)
		h.onlyWinner(h.raceAcquire(100, func(int) idem.AcquireRequest { return req }), old.Fence+1, false)
	}},

	{name: "RaceFingerprints", run: func(h *harness) {
		// Half the callers send another request with the same key: one
		// caller wins; those with its fingerprint are in flight, the
		// others mismatch.
		fps := []idem.Fingerprint{"fp-a", "fp-b"}
		out := h.raceAcquire(100, func(i int) idem.AcquireRequest { return h.req("k", fps[i%2], longLease) })
		var winner idem.Fingerprint
		acquired := 0
		for i, o := range out {
			if o.res.Outcome == idem.Acquired {
				acquired++
				winner = fps[i%2]
			}
		}
		if acquired != 1 {
			h.Fatalf("%d callers acquired, want 1", acquired)
		}
		for i, o := range out {
			want := idem.InFlight
			if fps[i%2] != winner {
				want = idem.Mismatch
			}
			if o.res.Outcome != idem.Acquired && o.res.Outcome != want {
				h.Fatalf("caller with %s: %v, want %v (winner sent %s)", fps[i%2], o.res.Outcome, want, winner)
			}
			if o.res.Outcome != idem.Acquired && o.res.Record.Fingerprint != winner {
				h.Fatalf("caller with %s was shown fingerprint %q, want the winner's %q", fps[i%2], o.res.Record.Fingerprint, winner)
			}
		}
	}},

	{name: "RaceManyKeys", run: func(h *harness) {
		// Concurrent acquisitions of distinct keys do not interfere.
		out := h.raceAcquire(100, func(i int) idem.AcquireRequest { return h.req(fmt.Sprintf("k-%d", i), "fp", longLease) })
		for i, o := range out {
			if o.res.Outcome != idem.Acquired || o.res.Lease.Fence != 1 || o.res.Lease.Key != fmt.Sprintf("k-%d", i) {
				h.Fatalf("key k-%d: %v, want acquired with fence 1; %s", i, o.res.Outcome, fmtResult(o.res))
			}
		}
	}},
}
