package idem_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/memstore"
)

// TestNilStartIsTheGivenContext: an Observer whose Start returns nil does
// not break what it observes: the store calls run on the context given,
// and an Observer after it in Observers gets that context.
func TestNilStartIsTheGivenContext(t *testing.T) {
	t.Parallel()
	nilStart, rec := &obstest.NilStart{}, &obstest.Recorder{}
	s := idem.ObserveStore(memstore.New(nil), "memory", idem.Observers(nilStart, rec))
	ctx := context.Background()
	res, err := s.Acquire(ctx, idem.AcquireRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("Acquire = %+v, %v", res, err)
	}
	if err := s.Complete(ctx, res.Lease, idem.Response{StatusCode: 201}, time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	rec0, err := s.Get(ctx, "s", "k")
	if err != nil || rec0.Status != idem.StatusCompleted {
		t.Fatalf("Get = %+v, %v", rec0, err)
	}
	if nilStart.Ends() != 3 || len(rec.Ends(idem.KindStore)) != 3 {
		t.Fatalf("ends %d and %d, want 3 each", nilStart.Ends(), len(rec.Ends(idem.KindStore)))
	}
	for _, c := range rec.Calls() {
		if !c.Start && c.Parent == 0 {
			t.Errorf("the End of %s ran on a context that is not the Recorder's Start's", c.Event.Op)
		}
	}
}
