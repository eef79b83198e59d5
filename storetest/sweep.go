package storetest

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem"
)

// sweepAll calls Sweep with limit until it removes nothing and returns the
// total it removed. Other scopes' records count too: the store may be
// shared.
func (h *harness) sweepAll(limit int) int {
	h.Helper()
	total := 0
	for range 10000 {
		n, err := h.store.Sweep(h.ctx, limit)
		if err != nil {
			h.Fatalf("Sweep(%d): %v", limit, err)
		}
		want := limit
		if want <= 0 {
			want = idem.DefaultSweepLimit
		}
		if n < 0 || n > want {
			h.Fatalf("Sweep(%d) = %d, want 0..%d", limit, n, want)
		}
		if n == 0 {
			return total
		}
		total += n
	}
	h.Fatalf("Sweep(%d) still removes records after 10000 calls", limit)
	return total
}

// present reports whether key has a record.
func (h *harness) present(key string) bool {
	h.Helper()
	_, err := h.store.Get(h.ctx, h.scope, key)
	if err != nil && !errors.Is(err, idem.ErrNotFound) {
		h.Fatalf("Get(%q): %v", key, err)
	}
	return err == nil
}

// expiredCompleted creates n completed records that expire after
// shortRetention and returns their keys.
func (h *harness) expiredCompleted(prefix string, n int) []string {
	h.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%d", prefix, i)
		l := h.lease(h.req(keys[i], "fp", longLease))
		if err := h.store.Complete(h.ctx, l, idem.Response{StatusCode: 200}, shortRetention); err != nil {
			h.Fatalf("Complete: %v", err)
		}
	}
	return keys
}

var sweepCases = []testCase{
	{name: "Sweep", serial: true, run: func(h *harness) {
		retention := 200 * time.Millisecond
		// Expired: a completed record past its retention, and a processing
		// record abandoned for longer than its retention.
		gone := h.expiredCompleted("completed-expired", 1)
		abandoned := h.req("abandoned", "fp", shortLease)
		abandoned.Retention = retention
		h.lease(abandoned)
		gone = append(gone, "abandoned")

		// Kept: a live lease, a lapsed lease still within its retention,
		// a lease extended past its short retention, a record taken over
		// with a long lease, and a live completed record.
		h.lease(h.req("live", "fp", longLease))
		lapsed := h.req("lapsed", "fp", shortLease)
		h.lease(lapsed)
		extendedReq := h.req("extended", "fp", shortLease)
		extendedReq.Retention = retention
		extended := h.lease(extendedReq)
		if _, err := h.store.Extend(h.ctx, extended, longLease); err != nil {
			h.Fatalf("Extend: %v", err)
		}
		takenReq := h.req("taken", "fp", shortLease)
		takenReq.Retention = retention
		h.lease(takenReq)
		completed := h.lease(h.req("completed", "fp", longLease))
		h.complete(completed, idem.Response{StatusCode: 200})

		h.sleepPast(shortLease)
		takenReq.Lease = longLease
		if res := h.expect(takenReq, idem.Acquired); !res.TookOver {
			h.Fatalf("the taken record was not taken over")
		}
		h.sleepPast(retention) // the abandoned record is now past lease + retention

		h.sweepAll(100)
		for _, k := range gone {
			if h.present(k) {
				h.Fatalf("Sweep left the expired record %q: %s", k, fmtRecord(h.get(k)))
			}
		}
		for _, k := range []string{"live", "lapsed", "extended", "taken", "completed"} {
			if !h.present(k) {
				h.Fatalf("Sweep removed the record %q, which has not expired", k)
			}
		}
		// The survivors are intact: the extended lease is still held.
		h.expect(extendedReq, idem.InFlight)
		h.complete(extended, idem.Response{StatusCode: 200})
	}},

	{name: "SweepLimit", serial: true, run: func(h *harness) {
		h.sweepAll(0) // start from a store without expired records
		keys := h.expiredCompleted("expired", 5)
		h.sleepPast(shortRetention)

		n, err := h.store.Sweep(h.ctx, 2)
		if err != nil {
			h.Fatalf("Sweep(2): %v", err)
		}
		removed := 0
		for _, k := range keys {
			if !h.present(k) {
				removed++
			}
		}
		// Other records of a shared store may have expired meanwhile and
		// been removed instead of ours.
		if n > 2 || removed > n || n == 0 {
			h.Fatalf("Sweep(2) returned %d and removed %d of our 5 expired records; want 1..2 removed, ours among them at most that many", n, removed)
		}

		// A limit <= 0 means idem.DefaultSweepLimit, not "nothing".
		for _, limit := range []int{0, -1} {
			keys := h.expiredCompleted(fmt.Sprintf("limit%d", limit), 3)
			h.sleepPast(shortRetention)
			if n, err := h.store.Sweep(h.ctx, limit); err != nil || n < 3 {
				h.Fatalf("Sweep(%d) = %d, %v; want at least our 3 expired records removed", limit, n, err)
			}
			for _, k := range keys {
				if h.present(k) {
					h.Fatalf("Sweep(%d) left the expired record %q", limit, k)
				}
			}
		}
		h.sweepAll(1)
		for _, k := range keys {
			if h.present(k) {
				h.Fatalf("repeated Sweep(1) left the expired record %q", k)
			}
		}
	}},

	{name: "SweepEmpty", serial: true, run: func(h *harness) {
		h.sweepAll(0)
		h.lease(h.req("live", "fp", longLease))
		if n, err := h.store.Sweep(h.ctx, 10); err != nil || n != 0 {
			h.Fatalf("Sweep with nothing expired = %d, %v; want 0, nil", n, err)
		}
		if !h.present("live") {
			h.Fatal("Sweep removed a live lease")
		}
	}},
}
