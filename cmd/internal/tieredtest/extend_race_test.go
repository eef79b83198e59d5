package tieredtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/rediskey"
	"github.com/idemkit/idem/memstore"
	"github.com/idemkit/idem/tieredstore"
)

// TestExtendRefillRacingCompletion: a Guard ends its execution (Complete
// or Release) without waiting for the watchdog's renewal in progress: it
// cancels the renewal's context and goes on. When the renewal's read-back
// of the truth returned the processing record just before the completion,
// and its cache write lands after the completion's, the in-flight entry
// must not survive the renewal: it would answer InFlight (409) for up to
// MarkerTTL while the truth holds the stored response (Complete) or no
// record at all (Release, whose retry should run again).
func TestExtendRefillRacingCompletion(t *testing.T) {
	t.Parallel()
	rc := redisClient(t)
	for _, end := range []string{"Complete", "Release"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			truth := &hooked{Store: memstore.New(nil)}
			prefix := randomPrefix()
			// A long MarkerTTL keeps a stale entry alive however slow the
			// machine: the outcome must not depend on timing.
			s := newTiered(t, rc, rc, truth, &tieredstore.Config{Prefix: prefix, MarkerTTL: time.Hour})
			ctx := t.Context()
			req, first := acquireOne(t, s)
			renewal, cancelRenewal := context.WithCancel(ctx)
			defer cancelRenewal()
			var endErr error
			truth.afterGet = func(rec idem.Record) {
				// The renewal's read-back has the processing record. The
				// Guard's completion now halts the renewal and ends the
				// execution before the renewal writes the entry.
				if rec.Status != idem.StatusProcessing {
					t.Errorf("read-back = %v, want processing", rec.Status)
				}
				cancelRenewal()
				if end == "Complete" {
					endErr = s.Complete(ctx, first.Lease, idem.Response{StatusCode: 201, Body: []byte("done")}, time.Hour)
				} else {
					endErr = s.Release(ctx, first.Lease)
				}
			}
			// The renewal's outcome is ignored by the Guard, as here.
			_, _ = s.Extend(renewal, first.Lease, time.Hour)
			if truth.afterGet != nil {
				t.Fatal("the renewal did not read the record back")
			}
			if endErr != nil {
				t.Fatalf("%s: %v", end, endErr)
			}
			// The entry, if any, is the truth's state: never the renewal's
			// processing record.
			b, err := rc.Get(ctx, rediskey.Name(prefix, "t", "k")).Bytes()
			if err == nil && len(b) > 1 && b[1] == 'p' {
				t.Errorf("cache entry is the processing record after %s", end)
			}
			hits := s.Stats().Hits
			retry, err := s.Acquire(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			want := idem.Completed
			if end == "Release" {
				want = idem.Acquired
			}
			if retry.Outcome != want {
				t.Fatalf("retry after %s = %v (cache hits %d → %d), want %v", end, retry.Outcome, hits, s.Stats().Hits, want)
			}
			rec, err := truth.Store.Get(ctx, "t", "k")
			if end == "Complete" && (err != nil || rec.Status != idem.StatusCompleted || string(rec.Response.Body) != "done") {
				t.Fatalf("truth = %+v, %v; want the completed record", rec, err)
			}
			if end == "Release" && (err != nil || rec.Fence == first.Lease.Fence && rec.Owner == first.Lease.Owner) {
				t.Fatalf("truth = %+v, %v; want the retry's lease", rec, err)
			}
		})
	}
}

// lostReply is a truth whose Release and Complete act, then answer an
// error as if the reply had been lost on the way back.
type lostReply struct {
	idem.Store
}

var errReplyLost = errors.New("read tcp: connection reset by peer")

func (l lostReply) Release(ctx context.Context, lease idem.Lease) error {
	if err := l.Store.Release(ctx, lease); err != nil {
		return err
	}
	return errReplyLost
}

func (l lostReply) Complete(ctx context.Context, lease idem.Lease, resp idem.Response, retention time.Duration) error {
	if err := l.Store.Complete(ctx, lease, resp, retention); err != nil {
		return err
	}
	return errReplyLost
}

// lostReplyRecord is lostReply over a truth that returns the record it
// completes (sqlstore): its CompleteRecord acts, then reports a lost
// reply too.
type lostReplyRecord struct {
	lostReply
}

func (l lostReplyRecord) CompleteRecord(ctx context.Context, lease idem.Lease, resp idem.Response, retention time.Duration) (idem.Record, error) {
	if _, err := l.Store.(tieredstore.RecordCompleter).CompleteRecord(ctx, lease, resp, retention); err != nil {
		return idem.Record{}, err
	}
	return idem.Record{}, errReplyLost
}

// TestEndingWithLostReplyDropsEntry: a Release or Complete whose truth
// acted but whose reply was lost answers an error, and a Release sent
// again answers idem.ErrLeaseLost (the record is gone). Neither may leave
// the in-flight entry behind: it would answer InFlight (409) for up to
// MarkerTTL to retries that the truth would let run (Release) or answer
// with the stored response (Complete).
func TestEndingWithLostReplyDropsEntry(t *testing.T) {
	t.Parallel()
	rc := redisClient(t)
	for _, end := range []string{"Complete", "CompleteRecord", "Release"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			var mem idem.Store = memstore.New(nil)
			var truth idem.Store = lostReply{Store: mem}
			if end == "CompleteRecord" {
				_, mem = newTruth(t)
				truth = lostReplyRecord{lostReply{Store: mem}}
				end = "Complete"
			}
			prefix := randomPrefix()
			s := newTiered(t, rc, rc, truth, &tieredstore.Config{Prefix: prefix, MarkerTTL: time.Hour})
			ctx := t.Context()
			req, first := acquireOne(t, s)
			var err error
			if end == "Complete" {
				err = s.Complete(ctx, first.Lease, idem.Response{StatusCode: 201, Body: []byte("done")}, time.Hour)
			} else {
				err = s.Release(ctx, first.Lease)
				if !errors.Is(err, errReplyLost) {
					t.Fatalf("Release = %v, want the lost reply", err)
				}
				// Sent again, as a caller unsure of the first would.
				err = s.Release(ctx, first.Lease)
				if !errors.Is(err, idem.ErrLeaseLost) {
					t.Fatalf("Release sent again = %v, want ErrLeaseLost", err)
				}
			}
			if err == nil {
				t.Fatalf("%s = nil, want an error", end)
			}
			if b, err := rc.Get(ctx, rediskey.Name(prefix, "t", "k")).Bytes(); err == nil && len(b) > 1 && b[1] == 'p' {
				t.Errorf("cache entry is the processing record after %s", end)
			}
			retry, err := s.Acquire(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			want := idem.Completed
			if end == "Release" {
				want = idem.Acquired
			}
			if retry.Outcome != want {
				t.Fatalf("retry after %s = %v, want %v", end, retry.Outcome, want)
			}
			rec, err := mem.Get(ctx, "t", "k")
			if end == "Complete" && (err != nil || rec.Status != idem.StatusCompleted || string(rec.Response.Body) != "done") {
				t.Fatalf("truth = %+v, %v; want the completed record", rec, err)
			}
			if end == "Release" && (err != nil || rec.Owner != retry.Lease.Owner || rec.Fence != retry.Lease.Fence) {
				t.Fatalf("truth = %+v, %v; want the retry's lease", rec, err)
			}
		})
	}
}
