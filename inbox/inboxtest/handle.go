package inboxtest

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/inbox"
)

// handleLease is the lease of the Handle cases: long enough that a loaded
// machine renews it in time once the first renewal went wrong (after one
// that hung for a third of it, the retry has a little under a third, 360
// ms, to be confirmed).
const handleLease = 1200 * time.Millisecond

// errExtend is the error of an Extend that flakyExtend fails at once.
var errExtend = errors.New("inboxtest: extend failed (a connection reset)")

// flakyExtend is the store under test whose first fail Extends do not
// reach it: they fail at once, or, with hang, wait for their context to
// end (a connection that stalls under a driver that honours contexts).
type flakyExtend struct {
	inbox.Store
	hang  bool
	fail  int64
	calls atomic.Int64
}

func (s *flakyExtend) Extend(ctx context.Context, group, id string, fence int64, lease time.Duration) error {
	if s.calls.Add(1) <= s.fail {
		if s.hang {
			<-ctx.Done()
			return ctx.Err()
		}
		return errExtend
	}
	return s.Store.Extend(ctx, group, id, fence, lease)
}

// testHandleRenewsAfterBadExtend: Handle's first renewals of a lease go
// wrong (they fail at once, or one hangs), and the handler runs three
// leases while another delivery of the message tries to claim it all
// along. The renewal must be retried soon enough to keep the lease: the
// other delivery never claims it, the handler's context is never
// cancelled, and the record ends succeeded under the first fence. A
// renewal that hangs must not hold up the renewals after it, nor Handle
// once the handler returned.
func testHandleRenewsAfterBadExtend(hang bool, fail int64) func(h *harness) {
	return func(h *harness) {
		id := h.newID()
		s := &flakyExtend{Store: h.store, hang: hang, fail: fail}
		in, err := inbox.New(s, &inbox.Config{Group: h.group, Lease: handleLease})
		if err != nil {
			h.Fatal(err)
		}
		ran := make(chan struct{})
		stopRival := make(chan struct{})
		var rivalClaims, rivalCalls atomic.Int64
		rivalDone := make(chan struct{})
		go func() { // another delivery of the message
			defer close(rivalDone)
			<-ran
			for {
				select {
				case <-stopRival:
					return
				case <-time.After(20 * time.Millisecond):
				}
				c, err := h.store.Claim(h.ctx, h.group, id, long, maxA)
				rivalCalls.Add(1)
				if err == nil && c.Claimed {
					rivalClaims.Add(1)
					return
				}
			}
		}()
		type result struct {
			o      inbox.Outcome
			err    error
			hcause error
		}
		done := make(chan result, 1)
		go func() {
			var hcause error
			o, err := in.Handle(h.ctx, inbox.Message{ID: id}, func(ctx context.Context, d inbox.Delivery) error {
				close(ran)
				select {
				case <-ctx.Done():
					hcause = context.Cause(ctx)
				case <-time.After(3 * handleLease):
				}
				return nil
			})
			done <- result{o, err, hcause}
		}()
		var r result
		select {
		case r = <-done:
		case <-time.After(3*handleLease + 10*time.Second):
			close(stopRival)
			h.Fatalf("Handle did not return within 10 s of its handler's end (%d Extend calls)", s.calls.Load())
		}
		close(stopRival)
		<-rivalDone
		if n := rivalClaims.Load(); n != 0 {
			h.Errorf("another delivery claimed the message while the handler ran (Extend calls %d)", s.calls.Load())
		}
		if rivalCalls.Load() == 0 {
			h.Errorf("the other delivery never tried to claim")
		}
		if r.hcause != nil {
			h.Errorf("the handler's context was cancelled: %v", r.hcause)
		}
		if r.err != nil || r.o.Result != inbox.Processed || r.o.Fence != 1 {
			h.Errorf("Handle = %+v, %v; want processed under fence 1", r.o, r.err)
		}
		// Three leases, renewed every third (or sooner after a failure):
		// at least the failures and the renewals after them, and no tight
		// loop.
		if n := s.calls.Load(); n < fail+2 || n > 40 {
			h.Errorf("%d Extend calls; want %d to 40", n, fail+2)
		}
		if !h.Failed() {
			h.want(id, inbox.StatusSucceeded, 1, 1)
		}
	}
}
