package storetest

import (
	"time"

	"github.com/idemkit/idem"
)

// wrongLeases returns leases that do not hold l's record: another owner,
// other fences, another key.
func wrongLeases(l idem.Lease) map[string]idem.Lease {
	otherOwner, fenceUp, fenceDown, otherKey, noOwner := l, l, l, l, l
	otherOwner.Owner = idem.NewOwner()
	fenceUp.Fence++
	fenceDown.Fence--
	otherKey.Key += "-other"
	noOwner.Owner = ""
	return map[string]idem.Lease{
		"another owner": otherOwner, "fence + 1": fenceUp, "fence - 1": fenceDown,
		"another key": otherKey, "empty owner": noOwner,
	}
}

var leaseCases = []testCase{
	{name: "Complete", run: func(h *harness) {
		req := h.req("k", "fp", longLease)
		l := h.lease(req)
		resp := idem.Response{StatusCode: 201, Header: map[string][]string{"Location": {"/orders/1"}}, Body: []byte(`{"id":1}`)}
		retention := 3 * time.Hour
		if err := h.store.Complete(h.ctx, l, resp, retention); err != nil {
			h.Fatalf("Complete: %v", err)
		}
		rec := h.get("k")
		h.checkCompleted(rec, "fp", l, resp, retention)
	}},

	{name: "CompleteAfterLeaseEnd", run: func(h *harness) {
		// Nobody took the key over: the lease's owner may still complete.
		l := h.lease(h.req("k", "fp", shortLease))
		h.sleepPast(shortLease)
		resp := idem.Response{StatusCode: 200, Body: []byte("slow")}
		h.complete(l, resp)
		h.checkCompleted(h.get("k"), "fp", l, resp, longRetention)
	}},

	{name: "CompleteWrongLease", run: func(h *harness) {
		l := h.lease(h.req("k", "fp", longLease))
		h.lease(h.req("k-other", "fp", longLease)) // so that "another key" names a held record
		before := h.get("k")
		for name, wrong := range wrongLeases(l) {
			h.leaseLost("Complete with "+name, h.store.Complete(h.ctx, wrong, idem.Response{StatusCode: 500}, longRetention))
			h.unchanged("k", before, "Complete with "+name)
		}
		resp := idem.Response{StatusCode: 200}
		h.complete(l, resp)
		h.checkCompleted(h.get("k"), "fp", l, resp, longRetention)
	}},

	{name: "CompleteTwice", run: func(h *harness) {
		// A Complete whose reply was lost is retried with the same lease:
		// the record already holds this execution's response, so the
		// retry succeeds and changes nothing, whatever it carries.
		l := h.lease(h.req("k", "fp", longLease))
		first := idem.Response{StatusCode: 200, Header: map[string][]string{"X-A": {"1"}}, Body: []byte("first")}
		h.complete(l, first)
		before := h.get("k")
		for _, again := range []idem.Response{first, {StatusCode: 500, Body: []byte("second")}} {
			if err := h.store.Complete(h.ctx, l, again, 2*longRetention); err != nil {
				h.Fatalf("Complete again with the same lease = %v, want nil", err)
			}
			h.unchanged("k", before, "a second Complete with the same lease")
		}
		h.checkCompleted(h.get("k"), "fp", l, first, longRetention)
		// Another owner or fence is still refused.
		for name, wrong := range wrongLeases(l) {
			h.leaseLost("Complete of a completed record with "+name, h.store.Complete(h.ctx, wrong, first, longRetention))
		}
		h.unchanged("k", before, "a refused Complete")
	}},

	{name: "CompleteAfterTakeover", run: func(h *harness) {
		// The stale lease's retry after a takeover is refused, before and
		// after the winner completed.
		req := h.req("k", "fp", shortLease)
		stale := h.lease(req)
		h.sleepPast(shortLease)
		req.Lease = longLease
		won := h.expect(req, idem.Acquired).Lease
		h.leaseLost("stale Complete before the winner's", h.store.Complete(h.ctx, stale, idem.Response{StatusCode: 500}, longRetention))
		resp := idem.Response{StatusCode: 200, Body: []byte("winner")}
		h.complete(won, resp)
		before := h.get("k")
		h.leaseLost("stale Complete after the winner's", h.store.Complete(h.ctx, stale, idem.Response{StatusCode: 500}, longRetention))
		h.unchanged("k", before, "a stale Complete")
		if err := h.store.Complete(h.ctx, won, idem.Response{StatusCode: 500}, longRetention); err != nil {
			h.Fatalf("the winner's Complete again = %v, want nil", err)
		}
		h.unchanged("k", before, "the winner's second Complete")
	}},

	{name: "CompleteMissing", run: func(h *harness) {
		l := idem.Lease{Scope: h.scope, Key: "never", Owner: idem.NewOwner(), Fence: 1, Until: time.Now().Add(time.Minute)}
		h.leaseLost("Complete of a missing record", h.store.Complete(h.ctx, l, idem.Response{}, longRetention))
		h.notFound("never")
	}},

	{name: "CompleteInvalidRetention", run: func(h *harness) {
		l := h.lease(h.req("k", "fp", longLease))
		before := h.get("k")
		for _, retention := range []time.Duration{0, -time.Hour} {
			if err := h.store.Complete(h.ctx, l, idem.Response{StatusCode: 200}, retention); err == nil {
				h.Fatalf("Complete with retention %v succeeded, want an error", retention)
			}
			h.unchanged("k", before, "a refused Complete")
		}
		h.complete(l, idem.Response{StatusCode: 200})
	}},

	{name: "Extend", run: func(h *harness) {
		req := h.req("k", "fp", shortLease)
		l := h.lease(req)
		ext, err := h.store.Extend(h.ctx, l, longLease)
		if err != nil {
			h.Fatalf("Extend: %v", err)
		}
		if ext.Scope != l.Scope || ext.Key != l.Key || ext.Owner != l.Owner || ext.Fence != l.Fence {
			h.Fatalf("Extend returned %+v, want the same lease as %+v with a new Until", ext, l)
		}
		h.near("extended Until", ext.Until, time.Now().Add(longLease), skew)
		rec := h.get("k")
		h.near("LeaseUntil", rec.LeaseUntil, ext.Until, h.tol())
		h.near("ExpiresAt", rec.ExpiresAt, rec.LeaseUntil.Add(req.Retention), h.tol())
		h.nearDuration("Retention", rec.Retention, req.Retention, h.caps.Precision)

		// Past the original lease's end, the key is still held.
		h.sleepPast(shortLease)
		h.expect(req, idem.InFlight)
		// Owner and fence make the lease: the original value still works.
		resp := idem.Response{StatusCode: 200}
		h.complete(l, resp)
		h.checkCompleted(h.get("k"), "fp", l, resp, longRetention)
	}},

	{name: "ExtendShortens", run: func(h *harness) {
		// Extend sets the end to now + ttl, even when that is sooner.
		req := h.req("k", "fp", longLease)
		l := h.lease(req)
		ext, err := h.store.Extend(h.ctx, l, shortLease)
		if err != nil {
			h.Fatalf("Extend: %v", err)
		}
		h.near("extended Until", ext.Until, time.Now().Add(shortLease), skew)
		h.sleepPast(shortLease)
		res := h.expect(req, idem.Acquired)
		if !res.TookOver || res.Lease.Fence != l.Fence+1 {
			h.Fatalf("after a shortened lease: took over %v fence %d, want a takeover with fence %d", res.TookOver, res.Lease.Fence, l.Fence+1)
		}
	}},

	{name: "ExtendAfterLeaseEnd", run: func(h *harness) {
		req := h.req("k", "fp", shortLease)
		l := h.lease(req)
		h.sleepPast(shortLease)
		ext, err := h.store.Extend(h.ctx, l, longLease)
		if err != nil {
			h.Fatalf("Extend after the lease's end, nobody took over: %v", err)
		}
		h.near("extended Until", ext.Until, time.Now().Add(longLease), skew)
		h.expect(req, idem.InFlight)
	}},

	{name: "ExtendLost", run: func(h *harness) {
		l := h.lease(h.req("k", "fp", longLease))
		h.lease(h.req("k-other", "fp", longLease))
		before := h.get("k")
		for name, wrong := range wrongLeases(l) {
			_, err := h.store.Extend(h.ctx, wrong, longLease)
			h.leaseLost("Extend with "+name, err)
			h.unchanged("k", before, "Extend with "+name)
		}
		for _, ttl := range []time.Duration{0, -time.Second} {
			if _, err := h.store.Extend(h.ctx, l, ttl); err == nil {
				h.Fatalf("Extend with ttl %v succeeded, want an error", ttl)
			}
			h.unchanged("k", before, "a refused Extend")
		}
		h.complete(l, idem.Response{StatusCode: 200})
		completed := h.get("k")
		_, err := h.store.Extend(h.ctx, l, longLease)
		h.leaseLost("Extend of a completed record", err)
		h.unchanged("k", completed, "Extend of a completed record")

		missing := idem.Lease{Scope: h.scope, Key: "never", Owner: idem.NewOwner(), Fence: 1}
		_, err = h.store.Extend(h.ctx, missing, longLease)
		h.leaseLost("Extend of a missing record", err)
		h.notFound("never")
	}},

	{name: "Release", run: func(h *harness) {
		req := h.req("k", "fp", longLease)
		l := h.lease(req)
		if err := h.store.Release(h.ctx, l); err != nil {
			h.Fatalf("Release: %v", err)
		}
		h.notFound("k")
		h.leaseLost("second Release", h.store.Release(h.ctx, l))
		h.leaseLost("Complete after Release", h.store.Complete(h.ctx, l, idem.Response{}, longRetention))
		_, err := h.store.Extend(h.ctx, l, longLease)
		h.leaseLost("Extend after Release", err)

		// A retry runs again, on a fresh record; the released lease
		// cannot touch it although the fence is the same.
		res := h.expect(req, idem.Acquired)
		if res.Lease.Fence != 1 || res.TookOver || res.Lease.Owner == l.Owner {
			h.Fatalf("Acquire after Release: fence %d took over %v owner %q; want a fresh record (fence 1, new owner)", res.Lease.Fence, res.TookOver, res.Lease.Owner)
		}
		h.checkHeld(h.get("k"), req, res.Lease)
		h.leaseLost("the released lease's Complete on the new record", h.store.Complete(h.ctx, l, idem.Response{}, longRetention))
		h.leaseLost("the released lease's Release of the new record", h.store.Release(h.ctx, l))
		h.checkHeld(h.get("k"), req, res.Lease)
	}},

	{name: "ReleaseAfterLeaseEnd", run: func(h *harness) {
		l := h.lease(h.req("k", "fp", shortLease))
		h.sleepPast(shortLease)
		if err := h.store.Release(h.ctx, l); err != nil {
			h.Fatalf("Release after the lease's end, nobody took over: %v", err)
		}
		h.notFound("k")
	}},

	{name: "ReleaseLost", run: func(h *harness) {
		l := h.lease(h.req("k", "fp", longLease))
		h.lease(h.req("k-other", "fp", longLease))
		before := h.get("k")
		for name, wrong := range wrongLeases(l) {
			h.leaseLost("Release with "+name, h.store.Release(h.ctx, wrong))
			h.unchanged("k", before, "Release with "+name)
		}
		h.complete(l, idem.Response{StatusCode: 200})
		completed := h.get("k")
		h.leaseLost("Release of a completed record", h.store.Release(h.ctx, l))
		h.unchanged("k", completed, "Release of a completed record")

		missing := idem.Lease{Scope: h.scope, Key: "never", Owner: idem.NewOwner(), Fence: 1}
		h.leaseLost("Release of a missing record", h.store.Release(h.ctx, missing))
	}},
}
