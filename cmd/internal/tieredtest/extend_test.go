package tieredtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
	"github.com/idemkit/idem/tieredstore"
)

// hooked is a truth that runs a hook once, right after its Extend has
// moved the lease or its Get has read the record, before the tiered
// store goes on.
type hooked struct {
	idem.Store
	afterExtend func(nl idem.Lease)
	afterGet    func(rec idem.Record)
}

func (h *hooked) Extend(ctx context.Context, l idem.Lease, ttl time.Duration) (idem.Lease, error) {
	nl, err := h.Store.Extend(ctx, l, ttl)
	if f := h.afterExtend; err == nil && f != nil {
		h.afterExtend = nil
		f(nl)
	}
	return nl, err
}

func (h *hooked) Get(ctx context.Context, scope, key string) (idem.Record, error) {
	rec, err := h.Store.Get(ctx, scope, key)
	if f := h.afterGet; err == nil && f != nil {
		h.afterGet = nil
		f(rec)
	}
	return rec, err
}

// acquireOne acquires ("t", "k") through s with an hour's lease and
// retention, and returns the request and its result.
func acquireOne(t *testing.T, s idem.Store) (idem.AcquireRequest, idem.AcquireResult) {
	t.Helper()
	req := idem.AcquireRequest{Scope: "t", Key: "k", Fingerprint: "fp", Lease: time.Hour, Retention: time.Hour}
	res, err := s.Acquire(t.Context(), req)
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("Acquire = %v, %v", res.Outcome, err)
	}
	return req, res
}

// TestShorterExtendNotAnsweredFromCache: an Extend that moves a lease's
// end earlier must not leave the in-flight entry answering with the old,
// later end while the call is in progress. The lincheck model found an
// Acquire answered InFlight from the entry after the truth's lease had
// ended and been free for the taking; with the entry deleted before the
// truth moves the lease, that Acquire is decided by the truth.
func TestShorterExtendNotAnsweredFromCache(t *testing.T) {
	t.Parallel()
	rc := redisClient(t)
	truth := &hooked{Store: memstore.New(nil)}
	s := newTiered(t, rc, rc, truth, &tieredstore.Config{Prefix: randomPrefix()})
	ctx := t.Context()
	req, first := acquireOne(t, s)
	// The entry now answers duplicates: InFlight, without the truth.
	if dup, err := s.Acquire(ctx, req); err != nil || dup.Outcome != idem.InFlight {
		t.Fatalf("duplicate = %v, %v; want InFlight", dup.Outcome, err)
	}
	hitsBefore := s.Stats().Hits
	var during idem.AcquireResult
	var duringErr error
	truth.afterExtend = func(nl idem.Lease) {
		// The truth's lease is now 20 ms long: wait until it has ended,
		// then ask as a retry would, before Extend rewrites the entry.
		for time.Now().Before(nl.Until.Add(time.Millisecond)) {
			time.Sleep(time.Millisecond)
		}
		during, duringErr = s.Acquire(ctx, req)
	}
	if _, err := s.Extend(ctx, first.Lease, 20*time.Millisecond); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if duringErr != nil || during.Outcome != idem.Acquired {
		t.Fatalf("Acquire after the shortened lease ended = %v, %v; want Acquired (a takeover)", during.Outcome, duringErr)
	}
	if during.Lease.Fence <= first.Lease.Fence {
		t.Fatalf("takeover fence %d, first %d", during.Lease.Fence, first.Lease.Fence)
	}
	if hits := s.Stats().Hits; hits != hitsBefore {
		t.Fatalf("cache hits %d → %d: the takeover was answered from the cache", hitsBefore, hits)
	}
	rec, err := truth.Get(ctx, "t", "k")
	if err != nil || rec.Owner != during.Lease.Owner || rec.Fence != during.Lease.Fence {
		t.Fatalf("truth = %+v, %v; want the takeover's lease", rec, err)
	}
}
