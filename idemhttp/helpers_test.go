package idemhttp_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/httpharness"
)

// The harness shared with the stores' tests of the middleware, under
// the names these tests use.
type (
	env     = httpharness.Env
	problem = httpharness.Problem
)

var (
	setup       = httpharness.Setup
	echoHandler = httpharness.EchoHandler
	request     = httpharness.Request
	wantProblem = httpharness.WantProblem
)

// flakyStore wraps a store and fails the operations switched on.
type flakyStore struct {
	idem.Store
	acquire, complete, release, get atomic.Bool
	// noExtend, when set, fails the renewals of the execution with this
	// owner.
	noExtend atomic.Pointer[string]
}

var errDown = errors.New("store down")

// renewedLease is a lease whose renewals (every third of it) reach the
// store long before it ends, also on a loaded machine whose timers run
// hundreds of milliseconds late: the tests that need the store to answer
// a renewal, rather than the lease to run out first, hold it. (With a
// 30 ms lease a timer 20 ms late let the guard give the lease up on its
// own clock, "lease may have ended", before any renewal was refused.)
const renewedLease = 1500 * time.Millisecond

func (s *flakyStore) Acquire(ctx context.Context, req idem.AcquireRequest) (idem.AcquireResult, error) {
	if s.acquire.Load() {
		return idem.AcquireResult{}, errDown
	}
	return s.Store.Acquire(ctx, req)
}

func (s *flakyStore) Complete(ctx context.Context, l idem.Lease, resp idem.Response, retention time.Duration) error {
	if s.complete.Load() {
		return errDown
	}
	return s.Store.Complete(ctx, l, resp, retention)
}

func (s *flakyStore) Release(ctx context.Context, l idem.Lease) error {
	if s.release.Load() {
		return errDown
	}
	return s.Store.Release(ctx, l)
}

func (s *flakyStore) Extend(ctx context.Context, l idem.Lease, ttl time.Duration) (idem.Lease, error) {
	if owner := s.noExtend.Load(); owner != nil && *owner == l.Owner {
		return idem.Lease{}, errDown
	}
	return s.Store.Extend(ctx, l, ttl)
}

func (s *flakyStore) Get(ctx context.Context, scope, key string) (idem.Record, error) {
	if s.get.Load() {
		return idem.Record{}, errDown
	}
	return s.Store.Get(ctx, scope, key)
}

// fakeClock is a settable clock for memstore.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
