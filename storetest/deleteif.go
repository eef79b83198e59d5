package storetest

import (
	"errors"
	"fmt"
	"sync"

	"github.com/idemkit/idem"
)

// deleteIf calls the store's DeleteIf with rec's owner and fence.
func (h *harness) deleteIf(scope string, rec idem.Record) error {
	return h.store.(idem.ConditionalDeleter).DeleteIf(h.ctx, scope, rec.Key, rec.Owner, rec.Fence)
}

// changed fails the case unless err is idem.ErrRecordChanged.
func (h *harness) changed(op string, err error) {
	h.Helper()
	if !errors.Is(err, idem.ErrRecordChanged) {
		h.Fatalf("%s = %v, want idem.ErrRecordChanged", op, err)
	}
}

var deleteIfCases = []testCase{
	{name: "DeleteIfRead", deleteIf: true, run: func(h *harness) {
		// The record read is deleted, in any state: processing with a
		// live lease, processing with its lease ended, completed.
		live := h.lease(h.req("live", "fp", longLease))
		h.lease(h.req("lapsed", "fp", shortLease))
		done := h.lease(h.req("done", "fp", longLease))
		h.complete(done, idem.Response{StatusCode: 200, Body: []byte("done")})
		h.sleepPast(shortLease)
		for _, key := range []string{"live", "lapsed", "done"} {
			rec := h.get(key)
			// Another owner or another fence is not the record read.
			other := rec
			other.Owner = idem.NewOwner()
			h.changed("DeleteIf of the "+key+" record with another owner", h.deleteIf(h.scope, other))
			other = rec
			other.Fence++
			h.changed("DeleteIf of the "+key+" record with another fence", h.deleteIf(h.scope, other))
			h.unchanged(key, rec, "a refused DeleteIf")
			if err := h.deleteIf(h.scope, rec); err != nil {
				h.Fatalf("DeleteIf of the %s record with its owner and fence: %v", key, err)
			}
			h.notFound(key)
			if err := h.deleteIf(h.scope, rec); !errors.Is(err, idem.ErrNotFound) {
				h.Fatalf("second DeleteIf of the %s record = %v, want idem.ErrNotFound", key, err)
			}
			if key == "live" {
				h.leaseLost("Complete of the deleted live record", h.store.Complete(h.ctx, live, idem.Response{}, longRetention))
				h.notFound(key)
			}
			// Nothing of the record is left (a cache in front included):
			// the next request runs.
			res := h.expect(h.req(key, "fp-new", longLease), idem.Acquired)
			if res.Lease.Fence != 1 || res.TookOver {
				h.Fatalf("Acquire after DeleteIf of the %s record: fence %d took over %v, want a fresh record", key, res.Lease.Fence, res.TookOver)
			}
		}
	}},

	{name: "DeleteIfAfterTakeover", deleteIf: true, run: func(h *harness) {
		// The operator read an abandoned record; a retry took it over
		// before the deletion: the live execution's record stays.
		req := h.req("k", "fp", shortLease)
		h.lease(req)
		read := h.get("k")
		h.sleepPast(shortLease)
		req.Lease = longLease
		res := h.expect(req, idem.Acquired)
		if !res.TookOver || res.Lease.Fence != read.Fence+1 {
			h.Fatalf("takeover: fence %d took over %v, want fence %d taken over", res.Lease.Fence, res.TookOver, read.Fence+1)
		}
		now := h.get("k")
		h.changed("DeleteIf of the record taken over", h.deleteIf(h.scope, read))
		h.unchanged("k", now, "a DeleteIf of the record it replaced")
		h.complete(res.Lease, idem.Response{StatusCode: 201})
		h.changed("DeleteIf of the record taken over, once completed", h.deleteIf(h.scope, read))
		if rec := h.get("k"); rec.Status != idem.StatusCompleted || rec.Owner != res.Lease.Owner {
			h.Fatalf("after the refused DeleteIf: %s, want the new owner's completed record", fmtRecord(rec))
		}
	}},

	{name: "DeleteIfAfterReplace", deleteIf: true, run: func(h *harness) {
		// The operator read a completed record; it expired and a new
		// request replaced it before the deletion.
		old := h.lease(h.req("k", "fp", longLease))
		if err := h.store.Complete(h.ctx, old, idem.Response{StatusCode: 200}, shortRetention); err != nil {
			h.Fatalf("Complete: %v", err)
		}
		read := h.get("k")
		h.sleepPast(shortRetention)
		res := h.expect(h.req("k", "fp-new", longLease), idem.Acquired)
		now := h.get("k")
		h.changed("DeleteIf of the record replaced", h.deleteIf(h.scope, read))
		h.unchanged("k", now, "a DeleteIf of the record it replaced")
		if now.Owner != res.Lease.Owner {
			h.Fatalf("the record is %s, want the new lease's", fmtRecord(now))
		}
	}},

	{name: "DeleteIfAfterRecreate", deleteIf: true, run: func(h *harness) {
		// A record deleted and created again starts at fence 1 again: its
		// new owner tells it from the one read.
		h.lease(h.req("k", "fp", longLease))
		read := h.get("k")
		if err := h.store.Delete(h.ctx, h.scope, "k"); err != nil {
			h.Fatalf("Delete: %v", err)
		}
		h.lease(h.req("k", "fp", longLease))
		now := h.get("k")
		if now.Fence != read.Fence {
			h.Fatalf("the new record has fence %d, want %d (a new record)", now.Fence, read.Fence)
		}
		h.changed("DeleteIf of the record deleted and created again", h.deleteIf(h.scope, read))
		h.unchanged("k", now, "a DeleteIf of the record deleted before")
	}},

	{name: "DeleteIfMissing", deleteIf: true, run: func(h *harness) {
		if err := h.store.(idem.ConditionalDeleter).DeleteIf(h.ctx, h.scope, "never", idem.NewOwner(), 1); !errors.Is(err, idem.ErrNotFound) {
			h.Fatalf("DeleteIf of a missing record = %v, want idem.ErrNotFound", err)
		}
	}},

	{name: "DeleteIfScopes", deleteIf: true, run: func(h *harness) {
		// The same key in another scope is another record.
		other := h.scope + "-other"
		h.lease(h.req("k", "fp", longLease))
		rec := h.get("k")
		if err := h.deleteIf(other, rec); !errors.Is(err, idem.ErrNotFound) {
			h.Fatalf("DeleteIf in a scope without the key = %v, want idem.ErrNotFound", err)
		}
		req := h.req("k", "fp", longLease)
		req.Scope = other
		h.lease(req)
		otherRec, err := h.store.Get(h.ctx, other, "k")
		if err != nil {
			h.Fatalf("Get in the other scope: %v", err)
		}
		h.changed("DeleteIf in another scope with this scope's owner and fence", h.deleteIf(other, rec))
		if err := h.deleteIf(h.scope, rec); err != nil {
			h.Fatalf("DeleteIf: %v", err)
		}
		h.notFound("k")
		after, err := h.store.Get(h.ctx, other, "k")
		if err != nil {
			h.Fatalf("the other scope's record after the DeleteIf: %v", err)
		}
		if d := DiffRecord(after, otherRec); d != "" {
			h.Fatalf("the other scope's record changed: %s", d)
		}
	}},

	{name: "RaceDeleteIf", deleteIf: true, run: func(h *harness) {
		// Many operators evict the record they read at once: one deletes
		// it, the others find none.
		h.lease(h.req("k", "fp", longLease))
		rec := h.get("k")
		out := race(50, func(int) error { return h.deleteIf(h.scope, rec) })
		deleted := 0
		for i, err := range out {
			switch {
			case err == nil:
				deleted++
			case !errors.Is(err, idem.ErrNotFound):
				h.Fatalf("racing DeleteIf %d = %v, want nil or idem.ErrNotFound", i, err)
			}
		}
		if deleted != 1 {
			h.Fatalf("%d racing DeleteIf calls deleted the record, want exactly 1", deleted)
		}
		h.notFound("k")
	}},

	{name: "RaceDeleteIfTakeover", deleteIf: true, run: func(h *harness) {
		// Evictions of an abandoned record race with retries that take
		// it over: whichever comes first, exactly one retry runs, and its
		// record is never deleted.
		req := h.req("k", "fp", shortLease)
		h.lease(req)
		read := h.get("k")
		h.sleepPast(shortLease)
		req.Lease = longLease
		type outcome struct {
			res idem.AcquireResult
			err error
		}
		out := race(100, func(i int) outcome {
			if i%2 == 0 {
				return outcome{err: h.deleteIf(h.scope, read)}
			}
			res, err := h.store.Acquire(h.ctx, req)
			return outcome{res: res, err: err}
		})
		var winners []idem.AcquireResult
		deleted := 0
		for i, o := range out {
			if i%2 == 0 {
				switch {
				case o.err == nil:
					deleted++
				case !errors.Is(o.err, idem.ErrRecordChanged) && !errors.Is(o.err, idem.ErrNotFound):
					h.Fatalf("racing DeleteIf %d = %v, want nil, idem.ErrRecordChanged or idem.ErrNotFound", i, o.err)
				}
				continue
			}
			if o.err != nil {
				h.Fatalf("racing Acquire %d: %v", i, o.err)
			}
			if o.res.Outcome == idem.Acquired {
				winners = append(winners, o.res)
			} else if o.res.Outcome != idem.InFlight {
				h.Fatalf("racing Acquire %d = %v, want acquired or in flight", i, o.res.Outcome)
			}
		}
		if deleted > 1 {
			h.Fatalf("%d racing DeleteIf calls deleted the record read, want at most 1", deleted)
		}
		// A retry that ran before the deletion took the record over; the
		// deletion then refused, and no later retry acquired.
		if len(winners) != 1 {
			h.Fatalf("%d racing Acquire calls acquired (DeleteIf deleted %d), want exactly 1", len(winners), deleted)
		}
		w := winners[0]
		switch {
		case deleted == 1 && (w.TookOver || w.Lease.Fence != 1):
			h.Fatalf("the record read was deleted, yet the winner took over (fence %d, took over %v): the deletion removed its record", w.Lease.Fence, w.TookOver)
		case deleted == 0 && (!w.TookOver || w.Lease.Fence != read.Fence+1):
			h.Fatalf("no DeleteIf deleted, yet the winner has fence %d, took over %v; want the takeover of fence %d", w.Lease.Fence, w.TookOver, read.Fence)
		}
		if rec := h.get("k"); rec.Owner != w.Lease.Owner || rec.Fence != w.Lease.Fence || rec.Status != idem.StatusProcessing {
			h.Fatalf("after the race the record is %s, want the winner's (owner %q, fence %d)", fmtRecord(rec), w.Lease.Owner, w.Lease.Fence)
		}
	}},
}

// deleteIfChurn is RaceDeleteIfChurn's work: rounds of workers per key
// that acquire, renew, complete or release, or read the record and evict
// it with DeleteIf, all at once.
const (
	churnKeys    = 4
	churnWorkers = 8 // per key
	churnRounds  = 12
)

func init() {
	deleteIfCases = append(deleteIfCases, testCase{name: "RaceDeleteIfChurn", deleteIf: true, run: raceDeleteIfChurn})
}

// raceDeleteIfChurn: evictions race with the executions of the record
// they read (renewals, completions, releases) and with the next
// request's, on several keys. Leases are long, so nothing but a DeleteIf
// takes a record from its holder: an execution that loses its lease lost
// it to a DeleteIf given its own owner and fence, and no record is deleted
// twice. Every call answers within the contract.
func raceDeleteIfChurn(h *harness) {
	var (
		mu      sync.Mutex
		deleted = map[string]int{}    // owner -> DeleteIf calls that deleted its record
		lost    = map[string]string{} // owner -> the operation that found its lease lost
		bad     []string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		bad = append(bad, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	cd := h.store.(idem.ConditionalDeleter)
	for round := range churnRounds {
		race(churnKeys*churnWorkers, func(i int) struct{} {
			key := fmt.Sprintf("churn-%d", i%churnKeys)
			req := h.req(key, "fp", longLease)
			res, err := h.store.Acquire(h.ctx, req)
			if err != nil {
				fail("round %d: Acquire of %s: %v", round, key, err)
				return struct{}{}
			}
			if res.Outcome != idem.Acquired {
				// Someone else's record: read it, and evict it as read.
				rec, err := h.store.Get(h.ctx, h.scope, key)
				switch {
				case errors.Is(err, idem.ErrNotFound):
					return struct{}{}
				case err != nil:
					fail("round %d: Get of %s: %v", round, key, err)
					return struct{}{}
				}
				err = cd.DeleteIf(h.ctx, h.scope, key, rec.Owner, rec.Fence)
				switch {
				case err == nil:
					mu.Lock()
					deleted[rec.Owner]++
					mu.Unlock()
				case !errors.Is(err, idem.ErrNotFound) && !errors.Is(err, idem.ErrRecordChanged):
					fail("round %d: DeleteIf of %s: %v", round, key, err)
				}
				return struct{}{}
			}
			l := res.Lease
			note := func(op string, err error) bool {
				switch {
				case err == nil:
					return true
				case errors.Is(err, idem.ErrLeaseLost):
					mu.Lock()
					lost[l.Owner] = op
					mu.Unlock()
				default:
					fail("round %d: %s of %s: %v", round, op, key, err)
				}
				return false
			}
			ext, err := h.store.Extend(h.ctx, l, longLease)
			if !note("Extend", err) {
				return struct{}{}
			}
			l.Until = ext.Until
			if i%3 == 0 {
				note("Release", h.store.Release(h.ctx, l))
			} else {
				note("Complete", h.store.Complete(h.ctx, l, idem.Response{StatusCode: 200}, longRetention))
			}
			return struct{}{}
		})
		// The round's records go, so that the next round acquires again.
		for k := range churnKeys {
			if err := h.store.Delete(h.ctx, h.scope, fmt.Sprintf("churn-%d", k)); err != nil && !errors.Is(err, idem.ErrNotFound) {
				h.Fatalf("Delete after round %d: %v", round, err)
			}
		}
	}
	if len(bad) > 0 {
		h.Fatalf("%d calls answered outside the contract, first: %s", len(bad), bad[0])
	}
	for owner, op := range lost {
		if deleted[owner] == 0 {
			h.Fatalf("an execution's %s found its lease lost, yet no DeleteIf was given its owner: a DeleteIf deleted a record it had not read", op)
		}
	}
	for _, n := range deleted {
		if n > 1 {
			h.Fatalf("%d DeleteIf calls deleted one record, want at most 1", n)
		}
	}
	if len(deleted) == 0 {
		h.Fatalf("no DeleteIf deleted a record in %d rounds: the race did not happen", churnRounds)
	}
}
