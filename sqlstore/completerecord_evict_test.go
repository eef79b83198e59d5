package sqlstore_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlstore"
)

// TestCompleteRecordRacingEviction: an operator evicts a record (DeleteIf
// with its owner and fence, as the operator page does) while its
// execution completes it. Whichever comes first, CompleteRecord answers
// within Complete's contract: nil, with the record it completed or no
// record (a zero Record: it was evicted right after its completion, and a
// cache must not keep it), or idem.ErrLeaseLost. On MySQL CompleteRecord
// reads the record back after completing it, and the eviction can fall
// between the two.
func TestCompleteRecordRacingEviction(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		_, s := srv.setup(t)
		ctx := t.Context()
		scope := randomName("crevict-")
		resp := idem.Response{StatusCode: 201, Body: []byte("done")}
		n := 300
		if srv.dialect == sqlstore.SQLite {
			n = 50 // one writer at a time: nothing falls between
		}
		var evictedAfter, lost int
		for i := range n {
			l := mustAcquire(t, s, idem.AcquireRequest{Scope: scope, Key: "k", Fingerprint: "fp", Lease: long, Retention: long}, idem.Acquired).Lease
			var (
				wg   sync.WaitGroup
				rec  idem.Record
				cerr error
				derr error
			)
			start := make(chan struct{})
			wg.Go(func() {
				<-start
				rec, cerr = s.CompleteRecord(ctx, l, resp, long)
			})
			wg.Go(func() {
				<-start
				derr = s.DeleteIf(ctx, scope, "k", l.Owner, l.Fence)
			})
			close(start)
			wg.Wait()
			if derr != nil {
				t.Fatalf("iteration %d: DeleteIf of the record read = %v, want nil", i, derr)
			}
			switch {
			case errors.Is(cerr, idem.ErrLeaseLost):
				lost++
			case cerr != nil:
				t.Fatalf("iteration %d: CompleteRecord racing an eviction = %v, want nil or idem.ErrLeaseLost", i, cerr)
			case rec.Owner == "":
				evictedAfter++
			case rec.Owner != l.Owner || rec.Fence != l.Fence || rec.Status != idem.StatusCompleted:
				t.Fatalf("iteration %d: CompleteRecord returned %+v, want the record it completed or none", i, rec)
			}
			if _, err := s.Get(ctx, scope, "k"); !errors.Is(err, idem.ErrNotFound) {
				t.Fatalf("iteration %d: after the eviction Get = %v, want idem.ErrNotFound", i, err)
			}
		}
		t.Logf("%d iterations: %d completions lost their lease to the eviction, %d were evicted before their record was read back", n, lost, evictedAfter)
	})
}
