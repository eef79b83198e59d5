package lincheck_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/lincheck"
)

// TestCheckerCatchesBrokenStores: the checker must fail a store with any
// one of the defects below, each a way a real store went wrong or could.
// A checker that passes them checks nothing.
func TestCheckerCatchesBrokenStores(t *testing.T) {
	for _, bug := range []string{"in-flight-acquired", "takeover-keeps-fence", "complete-ignores-lease", "sweep-live-lease", "expires-early", "complete-retry-refused", "own-lease-in-flight", "extend-returns-bare-until"} {
		t.Run(bug, func(t *testing.T) { catchesBug(t, bug, false) })
	}
}

// TestCheckerCatchesBrokenSplitStores: with StoreWorkload.SplitReadBack
// (an Acquire recorded as a write of unknown outcome and then its
// answer), the checker must still fail a store whose Acquire answers
// with the record its own write made: that lease was no other caller's.
func TestCheckerCatchesBrokenSplitStores(t *testing.T) {
	for _, bug := range []string{"own-lease-in-flight", "in-flight-acquired", "takeover-keeps-fence"} {
		t.Run(bug, func(t *testing.T) { catchesBug(t, bug, true) })
	}
}

// catchesBug fails t unless the checker fails a buggyStore with bug in
// one of three runs (a defect on a rare path may need another run).
func catchesBug(t *testing.T, bug string, split bool) {
	for range 3 {
		h, stats := lincheck.RunStore(context.Background(), &buggyStore{bug: bug, recs: map[string]*idem.Record{}},
			lincheck.StoreWorkload{Sweep: true, OpsPerClient: 300, SplitReadBack: split})
		if !h.Linearizable(lincheck.StoreModel(lincheck.StoreModelConfig{Margin: int64(5 * time.Millisecond)})) {
			return
		}
		t.Logf("not caught in a run of %v", stats)
	}
	t.Errorf("the checker passed a store whose %s (SplitReadBack %v)", bug, split)
}

// buggyStore is a store of the contract in memory with one defect.
type buggyStore struct {
	bug  string
	mu   sync.Mutex
	recs map[string]*idem.Record
	done map[string]bool // buggy "complete-retry-refused": lease already used
}

func (s *buggyStore) Acquire(_ context.Context, req idem.AcquireRequest) (idem.AcquireResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	r, ok := s.recs[req.Key]
	expires := func(r *idem.Record) time.Time {
		if s.bug == "expires-early" {
			return r.ExpiresAt.Add(-r.Retention / 2)
		}
		return r.ExpiresAt
	}
	fresh := func(fence int64, took bool) (idem.AcquireResult, error) {
		n := &idem.Record{Scope: req.Scope, Key: req.Key, Fingerprint: req.Fingerprint, Status: idem.StatusProcessing,
			Owner: idem.NewOwner(), Fence: fence, LeaseUntil: now.Add(req.Lease), Retention: req.Retention, CreatedAt: now}
		n.ExpiresAt = n.LeaseUntil.Add(req.Retention)
		s.recs[req.Key] = n
		return idem.AcquireResult{Outcome: idem.Acquired, TookOver: took, Record: *n,
			Lease: idem.Lease{Scope: n.Scope, Key: n.Key, Owner: n.Owner, Fence: n.Fence, Until: n.LeaseUntil}}, nil
	}
	switch {
	case !ok && s.bug == "own-lease-in-flight":
		// Writes a lease, then answers in flight with it, as a store that
		// writes and reads back in two statements could if it mistook its
		// own record for another's: nobody holds the lease, and the key
		// is stuck until the lease ends.
		_, _ = fresh(1, false)
		return idem.AcquireResult{Outcome: idem.InFlight, Record: *s.recs[req.Key]}, nil
	case !ok:
		return fresh(1, false)
	case !now.Before(expires(r)):
		return fresh(r.Fence+1, r.Status == idem.StatusProcessing)
	case r.Fingerprint != req.Fingerprint:
		return idem.AcquireResult{Outcome: idem.Mismatch, Record: *r}, nil
	case r.Status == idem.StatusCompleted:
		return idem.AcquireResult{Outcome: idem.Completed, Record: *r}, nil
	case now.Before(r.LeaseUntil) && s.bug != "in-flight-acquired":
		return idem.AcquireResult{Outcome: idem.InFlight, Record: *r}, nil
	case s.bug == "takeover-keeps-fence":
		return fresh(r.Fence, true)
	default:
		return fresh(r.Fence+1, true)
	}
}

func (s *buggyStore) held(l idem.Lease) (*idem.Record, bool) {
	r, ok := s.recs[l.Key]
	if !ok || r.Status != idem.StatusProcessing {
		return r, false
	}
	if s.bug == "complete-ignores-lease" {
		return r, true
	}
	return r, r.Owner == l.Owner && r.Fence == l.Fence
}

func (s *buggyStore) Complete(_ context.Context, l idem.Lease, resp idem.Response, retention time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.held(l)
	if !ok {
		if r != nil && r.Status == idem.StatusCompleted && r.Owner == l.Owner && r.Fence == l.Fence && s.bug != "complete-retry-refused" {
			return nil
		}
		return idem.ErrLeaseLost
	}
	now := time.Now()
	c := resp.Clone()
	r.Status, r.Response, r.CompletedAt, r.Retention, r.ExpiresAt = idem.StatusCompleted, &c, now, retention, now.Add(retention)
	r.Owner, r.Fence = l.Owner, l.Fence
	return nil
}

func (s *buggyStore) Release(_ context.Context, l idem.Lease) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.held(l); !ok {
		return idem.ErrLeaseLost
	}
	delete(s.recs, l.Key)
	return nil
}

func (s *buggyStore) Extend(_ context.Context, l idem.Lease, ttl time.Duration) (idem.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.held(l)
	if !ok {
		return idem.Lease{}, idem.ErrLeaseLost
	}
	r.LeaseUntil = time.Now().Add(ttl)
	r.ExpiresAt = r.LeaseUntil.Add(r.Retention)
	if s.bug == "extend-returns-bare-until" {
		// Moves the lease, but returns only its end: a caller that goes
		// on with the returned lease (as the contract lets it) presents
		// no owner or fence, its completion is refused, and once the
		// lease ends another execution takes the key over and runs the
		// effect again.
		return idem.Lease{Until: r.LeaseUntil}, nil
	}
	l.Until = r.LeaseUntil
	return l, nil
}

func (s *buggyStore) Get(_ context.Context, _, key string) (idem.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.recs[key]; ok {
		return *r, nil
	}
	return idem.Record{}, idem.ErrNotFound
}

func (s *buggyStore) Delete(_ context.Context, _, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.recs, key)
	return nil
}

func (s *buggyStore) Sweep(_ context.Context, _ int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	n := 0
	for k, r := range s.recs {
		live := r.Status == idem.StatusProcessing && now.Before(r.LeaseUntil)
		if s.bug == "sweep-live-lease" && r.Status == idem.StatusProcessing {
			live = false
		}
		if !now.Before(r.ExpiresAt) && !live || s.bug == "sweep-live-lease" && r.Status == idem.StatusProcessing {
			delete(s.recs, k)
			n++
		}
	}
	return n, nil
}
