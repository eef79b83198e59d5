package storetest

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
)

// createdByReplacement checks the CreatedAt of rec, the record that
// replaced the expired record old with lease l for req: it is a new
// record, created when the replacement was written, at the store's now
// (l.Until - req.Lease on the store's clock), not when old was.
func (h *harness) createdByReplacement(rec, old idem.Record, l idem.Lease, req idem.AcquireRequest) {
	h.Helper()
	written := l.Until.Add(-req.Lease)
	if rec.CreatedAt.Before(written.Add(-h.tol())) || rec.CreatedAt.After(written.Add(h.tol())) {
		h.Fatalf("the replacing record's CreatedAt is %v, want the store's now when it wrote it, %v (lease until %v - lease %v) ± %v; the replaced record was created at %v",
			rec.CreatedAt, written, l.Until, req.Lease, h.tol(), old.CreatedAt)
	}
}

var acquireCases = []testCase{
	{name: "AcquireNew", run: func(h *harness) {
		req := h.req("k", "fp", longLease)
		res := h.expect(req, idem.Acquired)
		if res.Lease.Fence != 1 || res.TookOver {
			h.Fatalf("new record: fence %d took over %v, want fence 1, not taken over", res.Lease.Fence, res.TookOver)
		}
		rec := h.get("k")
		h.checkHeld(rec, req, res.Lease)
		h.nearDuration("LeaseUntil - CreatedAt", rec.LeaseUntil.Sub(rec.CreatedAt), req.Lease, h.tol())

		// Owners are random: a second key gets another one.
		other := h.lease(h.req("k2", "fp", longLease))
		if other.Owner == res.Lease.Owner {
			h.Fatalf("two leases share the owner token %q", other.Owner)
		}
	}},

	{name: "AcquireInFlight", run: func(h *harness) {
		req := h.req("k", "fp", longLease)
		l := h.lease(req)
		before := h.get("k")
		res := h.expect(req, idem.InFlight)
		if res.Record.Status != idem.StatusProcessing || res.Record.Owner != l.Owner || res.Record.Fence != l.Fence || res.Record.Fingerprint != "fp" || res.Record.Key != "k" || res.Record.Scope != h.scope {
			h.Fatalf("InFlight record = %s, want the processing record of fence %d", fmtRecord(res.Record), l.Fence)
		}
		if d := DiffRecord(res.Record, before); d != "" {
			h.Fatalf("InFlight record differs from Get: %s", d)
		}
		h.unchanged("k", before, "an InFlight Acquire")
	}},

	{name: "AcquireCompleted", run: func(h *harness) {
		req := h.req("k", "fp", shortLease)
		l := h.lease(req)
		resp := idem.Response{StatusCode: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":1}`)}
		h.complete(l, resp)
		before := h.get("k")
		for _, when := range []string{"while the lease runs", "after the lease's end"} {
			if when != "while the lease runs" {
				h.sleepPast(shortLease) // a completed record has no lease to take over
			}
			res := h.acquire(req)
			if res.Outcome != idem.Completed {
				h.Fatalf("Acquire on a completed record %s = %v, want completed; %s", when, res.Outcome, fmtResult(res))
			}
			h.checkCompleted(res.Record, "fp", l, resp, longRetention)
			h.unchanged("k", before, "a Completed Acquire")
		}
	}},

	{name: "AcquireMismatchCompleted", run: func(h *harness) {
		l := h.lease(h.req("k", "fp-1", longLease))
		resp := idem.Response{StatusCode: 200, Body: []byte("one")}
		h.complete(l, resp)
		before := h.get("k")
		res := h.expect(h.req("k", "fp-2", longLease), idem.Mismatch)
		h.checkCompleted(res.Record, "fp-1", l, resp, longRetention)
		h.unchanged("k", before, "a Mismatch Acquire")
		// The empty fingerprint is a fingerprint like any other.
		h.expect(h.req("k", "", longLease), idem.Mismatch)
	}},

	{name: "AcquireMismatchInFlight", run: func(h *harness) {
		req := h.req("k", "fp-1", longLease)
		l := h.lease(req)
		before := h.get("k")
		res := h.expect(h.req("k", "fp-2", longLease), idem.Mismatch)
		if d := DiffRecord(res.Record, before); d != "" {
			h.Fatalf("Mismatch record differs from the stored one: %s", d)
		}
		h.checkHeld(res.Record, req, l)
		h.unchanged("k", before, "a Mismatch Acquire")
	}},

	{name: "AcquireMismatchExpiredLease", run: func(h *harness) {
		// A processing record whose lease ended is taken over only by the
		// same request: another fingerprint is refused, and the record
		// stays the original owner's.
		req := h.req("k", "fp-1", shortLease)
		l := h.lease(req)
		h.sleepPast(shortLease)
		before := h.get("k")
		res := h.expect(h.req("k", "fp-2", longLease), idem.Mismatch)
		if res.Record.Fingerprint != "fp-1" || res.Record.Fence != l.Fence || res.Record.Status != idem.StatusProcessing {
			h.Fatalf("Mismatch record = %s, want the processing record of fp-1 and fence %d", fmtRecord(res.Record), l.Fence)
		}
		h.unchanged("k", before, "a Mismatch Acquire on an expired lease")
		resp := idem.Response{StatusCode: 200, Body: []byte("late but first")}
		h.complete(l, resp)
		h.checkCompleted(h.get("k"), "fp-1", l, resp, longRetention)
	}},

	{name: "AcquireTakeover", run: func(h *harness) {
		req := h.req("k", "fp", shortLease)
		stale := h.lease(req)
		staleRec := h.get("k")
		h.sleepPast(shortLease)

		// The taker asks for another lease and retention: the record
		// takes both.
		req2 := req
		req2.Lease = longLease
		req2.Retention = 2 * longRetention
		res := h.expect(req2, idem.Acquired)
		won := res.Lease
		if !res.TookOver || won.Fence != stale.Fence+1 || won.Owner == stale.Owner {
			h.Fatalf("takeover: took over %v fence %d owner %q; want took over, fence %d, a new owner (old %q)", res.TookOver, won.Fence, won.Owner, stale.Fence+1, stale.Owner)
		}
		rec := h.get("k")
		h.checkHeld(rec, req2, won)
		// A takeover continues the abandoned execution's record: it was
		// created when the key was first acquired.
		if !rec.CreatedAt.Equal(staleRec.CreatedAt) {
			h.Fatalf("takeover changed CreatedAt from %v to %v; want it kept", staleRec.CreatedAt, rec.CreatedAt)
		}

		// The stale owner can do nothing any more.
		_, err := h.store.Extend(h.ctx, stale, longLease)
		h.leaseLost("stale Extend", err)
		h.unchanged("k", rec, "a stale Extend")
		h.leaseLost("stale Complete", h.store.Complete(h.ctx, stale, idem.Response{StatusCode: 500, Body: []byte("stale")}, longRetention))
		h.unchanged("k", rec, "a stale Complete")
		h.leaseLost("stale Release", h.store.Release(h.ctx, stale))
		h.unchanged("k", rec, "a stale Release")

		// The winner completes; the stale owner still cannot, and Get
		// serves the winner's response.
		resp := idem.Response{StatusCode: 200, Body: []byte("winner")}
		if err := h.store.Complete(h.ctx, won, resp, longRetention); err != nil {
			h.Fatalf("winner's Complete: %v", err)
		}
		h.leaseLost("stale Complete after the winner's", h.store.Complete(h.ctx, stale, idem.Response{StatusCode: 500, Body: []byte("stale")}, longRetention))
		h.checkCompleted(h.get("k"), "fp", won, resp, longRetention)
	}},

	{name: "AcquireTakeoverAgain", run: func(h *harness) {
		// Every takeover adds one to the fence.
		req := h.req("k", "fp", shortLease)
		owners := map[string]bool{}
		for want := int64(1); want <= 3; want++ {
			res := h.expect(req, idem.Acquired)
			if res.Lease.Fence != want || res.TookOver != (want > 1) || owners[res.Lease.Owner] {
				h.Fatalf("acquisition %d: fence %d took over %v owner %q (seen before: %v)", want, res.Lease.Fence, res.TookOver, res.Lease.Owner, owners[res.Lease.Owner])
			}
			owners[res.Lease.Owner] = true
			h.sleepPast(shortLease)
		}
	}},

	{name: "AcquireReplacesExpiredCompleted", run: func(h *harness) {
		// A completed record past its retention is replaced by a new
		// record, whatever the fingerprint; the fence keeps counting.
		for _, fp := range []idem.Fingerprint{"fp-1", "fp-2"} {
			key := "k-" + string(fp)
			old := h.lease(h.req(key, "fp-1", longLease))
			if err := h.store.Complete(h.ctx, old, idem.Response{StatusCode: 200, Body: []byte("old")}, shortRetention); err != nil {
				h.Fatalf("Complete: %v", err)
			}
			oldRec := h.get(key)
			h.sleepPast(shortRetention)
			req := h.req(key, fp, longLease)
			res := h.expect(req, idem.Acquired)
			if res.Lease.Fence != old.Fence+1 || res.TookOver || res.Lease.Owner == old.Owner {
				h.Fatalf("replacing an expired completed record with %s: fence %d took over %v owner %q; want fence %d, not taken over, a new owner", fp, res.Lease.Fence, res.TookOver, res.Lease.Owner, old.Fence+1)
			}
			rec := h.get(key)
			h.checkHeld(rec, req, res.Lease)
			h.createdByReplacement(rec, oldRec, res.Lease, req)
			h.leaseLost("the old lease's Complete", h.store.Complete(h.ctx, old, idem.Response{}, longRetention))
		}
	}},

	{name: "AcquireReplacesAbandoned", run: func(h *harness) {
		// A processing record whose lease ended more than its retention ago
		// is past its ExpiresAt: like an expired completed record it is
		// replaced whatever the fingerprint (the result Sweep would give),
		// and reported as a takeover.
		for _, fp := range []idem.Fingerprint{"fp-1", "fp-2"} {
			key := "k-" + string(fp)
			req := h.req(key, "fp-1", shortLease)
			req.Retention = shortRetention
			old := h.lease(req)
			oldRec := h.get(key)
			h.sleepPast(shortLease + shortRetention)
			req2 := h.req(key, fp, longLease)
			res := h.expect(req2, idem.Acquired)
			if res.Lease.Fence != old.Fence+1 || !res.TookOver || res.Lease.Owner == old.Owner {
				h.Fatalf("replacing an abandoned record with %s: fence %d took over %v owner %q; want fence %d, taken over, a new owner", fp, res.Lease.Fence, res.TookOver, res.Lease.Owner, old.Fence+1)
			}
			rec := h.get(key)
			h.checkHeld(rec, req2, res.Lease)
			h.createdByReplacement(rec, oldRec, res.Lease, req2)
			h.leaseLost("the abandoned lease's Complete", h.store.Complete(h.ctx, old, idem.Response{}, longRetention))
		}
	}},

	{name: "AcquireInvalidFingerprint", run: func(h *harness) {
		for name, fp := range map[string]idem.Fingerprint{
			"256 bytes": idem.Fingerprint(strings.Repeat("f", 256)),
			"NUL":       "v1:\x00",
			"newline":   "v1:\n",
			"bad UTF-8": "v1:\xff",
		} {
			res, err := h.store.Acquire(h.ctx, h.req("k", fp, longLease))
			if !errors.Is(err, idem.ErrInvalidFingerprint) {
				h.Fatalf("Acquire with a %s fingerprint = %s, %v; want idem.ErrInvalidFingerprint", name, fmtResult(res), err)
			}
		}
		if _, err := h.store.Get(h.ctx, h.scope, "k"); !errors.Is(err, idem.ErrNotFound) {
			h.Fatalf("a refused Acquire left a record (Get: %v)", err)
		}
		// The longest valid fingerprint and the empty one are kept as given.
		for _, fp := range []idem.Fingerprint{idem.Fingerprint(strings.Repeat("f", 255)), ""} {
			key := "k" + strconv.Itoa(len(fp))
			h.expect(h.req(key, fp, longLease), idem.Acquired)
			if got := h.get(key).Fingerprint; got != fp {
				h.Fatalf("stored fingerprint %q, want %q", got, fp)
			}
			h.expect(h.req(key, fp, longLease), idem.InFlight)
		}
	}},

	{name: "AcquireInvalidDurations", run: func(h *harness) {
		for _, tc := range []struct {
			name             string
			lease, retention time.Duration
		}{
			{"zero lease", 0, time.Hour},
			{"negative lease", -time.Second, time.Hour},
			{"zero retention", time.Minute, 0},
			{"negative retention", time.Minute, -time.Hour},
		} {
			req := idem.AcquireRequest{Scope: h.scope, Key: "k", Fingerprint: "fp", Lease: tc.lease, Retention: tc.retention}
			res, err := h.store.Acquire(h.ctx, req)
			if err == nil {
				h.Fatalf("Acquire with %s = %v, want an error", tc.name, fmtResult(res))
			}
			h.notFound("k")
		}
	}},

	{name: "CanceledContext", run: func(h *harness) {
		ctx, cancel := context.WithCancel(h.ctx)
		cancel()
		if res, err := h.store.Acquire(ctx, h.req("k", "fp", longLease)); err == nil {
			h.Fatalf("Acquire with a canceled context = %s, want an error", fmtResult(res))
		}
		h.notFound("k")
	}},
}
