package storetest

import (
	"errors"
	"time"

	"github.com/idemkit/idem"
)

var getDeleteCases = []testCase{
	{name: "GetMissing", run: func(h *harness) {
		h.notFound("never")
		h.lease(h.req("k", "fp", longLease))
		h.notFound("never") // another key of a scope that has records
		if _, err := h.store.Get(h.ctx, h.scope+"-other", "k"); !errors.Is(err, idem.ErrNotFound) {
			h.Fatalf("Get in another scope = %v, want idem.ErrNotFound", err)
		}
	}},

	{name: "GetExpired", run: func(h *harness) {
		// Get returns records past their ExpiresAt until they are
		// replaced or swept.
		l := h.lease(h.req("k", "fp", longLease))
		resp := idem.Response{StatusCode: 200, Body: []byte("old")}
		if err := h.store.Complete(h.ctx, l, resp, shortRetention); err != nil {
			h.Fatalf("Complete: %v", err)
		}
		h.sleepPast(shortRetention)
		rec := h.get("k")
		h.checkCompleted(rec, "fp", l, resp, shortRetention)
		if !rec.ExpiresAt.Before(time.Now()) {
			h.Fatalf("ExpiresAt %v is not past", rec.ExpiresAt)
		}
	}},

	{name: "DeleteMissing", run: func(h *harness) {
		if err := h.store.Delete(h.ctx, h.scope, "never"); !errors.Is(err, idem.ErrNotFound) {
			h.Fatalf("Delete of a missing record = %v, want idem.ErrNotFound", err)
		}
	}},

	{name: "DeleteAnyState", run: func(h *harness) {
		type state struct {
			name  string
			lease idem.Lease
		}
		var states []state
		// processing, live lease
		states = append(states, state{"live", h.lease(h.req("live", "fp", longLease))})
		// processing, lease ended, nobody took over
		states = append(states, state{"lapsed", h.lease(h.req("lapsed", "fp", shortLease))})
		// completed, live
		done := h.lease(h.req("done", "fp", longLease))
		h.complete(done, idem.Response{StatusCode: 200})
		states = append(states, state{"done", done})
		// completed, past its retention
		old := h.lease(h.req("old", "fp", longLease))
		if err := h.store.Complete(h.ctx, old, idem.Response{StatusCode: 200}, shortRetention); err != nil {
			h.Fatalf("Complete: %v", err)
		}
		states = append(states, state{"old", old})
		h.sleepPast(max(shortLease, shortRetention))

		for _, s := range states {
			h.get(s.name)
			if err := h.store.Delete(h.ctx, h.scope, s.name); err != nil {
				h.Fatalf("Delete of the %s record: %v", s.name, err)
			}
			h.notFound(s.name)
			if err := h.store.Delete(h.ctx, h.scope, s.name); !errors.Is(err, idem.ErrNotFound) {
				h.Fatalf("second Delete of the %s record = %v, want idem.ErrNotFound", s.name, err)
			}
			h.leaseLost("Complete of the deleted "+s.name+" record", h.store.Complete(h.ctx, s.lease, idem.Response{}, longRetention))
			res := h.expect(h.req(s.name, "fp-new", longLease), idem.Acquired)
			if res.Lease.Fence != 1 || res.TookOver {
				h.Fatalf("Acquire after deleting the %s record: fence %d took over %v, want a fresh record", s.name, res.Lease.Fence, res.TookOver)
			}
		}
	}},
}
