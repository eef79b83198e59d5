package inbox

import (
	"context"
	"sync"
	"time"
)

// MemoryStore is a Store in one process's memory: one mutex over a map.
// It keeps the Store contract (inboxtest passes) but not TxStore, so it
// serves Handle, tests and examples of a single instance. Its clock is
// the process's; nothing survives a restart.
type MemoryStore struct {
	mu   sync.Mutex
	recs map[[2]string]*Record
	now  func() time.Time
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{recs: map[[2]string]*Record{}, now: time.Now}
}

func (m *MemoryStore) clock() time.Time { return m.now().Round(0).Truncate(time.Millisecond) }

// Claim takes a record for a new attempt; see Store.
func (m *MemoryStore) Claim(ctx context.Context, group, id string, lease time.Duration, maxAttempts int) (Claim, error) {
	if err := ctx.Err(); err != nil {
		return Claim{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	r, ok := m.recs[[2]string{group, id}]
	if !ok {
		r = &Record{Group: group, ID: id, CreatedAt: now}
		m.recs[[2]string{group, id}] = r
	}
	claimable := !ok || r.Status == StatusFailed || (r.Status == StatusProcessing && !r.LeaseUntil.After(now))
	switch {
	case claimable && r.Status == StatusProcessing && r.Attempts >= maxAttempts:
		r.Status, r.UpdatedAt = StatusDead, now
	case claimable:
		r.Status = StatusProcessing
		r.Attempts++
		r.Fence++
		r.LeaseUntil = now.Add(ceilMS(lease))
		r.UpdatedAt = now
	}
	return Claim{Claimed: claimable && r.Status == StatusProcessing, Status: r.Status, Attempts: r.Attempts, Fence: r.Fence, LeaseUntil: r.LeaseUntil, Now: now}, nil
}

func ceilMS(d time.Duration) time.Duration {
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}

// held returns the record processing under fence, or nil.
func (m *MemoryStore) held(group, id string, fence int64) *Record {
	r, ok := m.recs[[2]string{group, id}]
	if !ok || r.Status != StatusProcessing || r.Fence != fence {
		return nil
	}
	return r
}

// Finish marks a record succeeded; see Store.
func (m *MemoryStore) Finish(ctx context.Context, group, id string, fence int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.held(group, id, fence)
	if r == nil {
		return ErrFenced
	}
	r.Status, r.UpdatedAt = StatusSucceeded, m.clock()
	return nil
}

// Fail ends a failed attempt; see Store.
func (m *MemoryStore) Fail(ctx context.Context, group, id string, fence int64, maxAttempts int, reason string) (Status, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.held(group, id, fence)
	if r == nil {
		return "", ErrFenced
	}
	r.Status = StatusFailed
	if r.Attempts >= maxAttempts {
		r.Status = StatusDead
	}
	r.LastError, r.UpdatedAt = reason, m.clock()
	r.LeaseUntil = r.UpdatedAt
	return r.Status, nil
}

// Extend extends a live lease; see Store.
func (m *MemoryStore) Extend(ctx context.Context, group, id string, fence int64, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	r := m.held(group, id, fence)
	if r == nil || !r.LeaseUntil.After(now) {
		return ErrFenced
	}
	r.LeaseUntil = now.Add(ceilMS(lease))
	return nil
}

// Get returns a record; see Store.
func (m *MemoryStore) Get(ctx context.Context, group, id string) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.recs[[2]string{group, id}]
	if !ok {
		return Record{}, ErrNotFound
	}
	return *r, nil
}

// Sweep removes old records and processing records abandoned long ago;
// see Store.
func (m *MemoryStore) Sweep(ctx context.Context, retention time.Duration, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	cut := m.clock().Add(-retention)
	n := 0
	for k, r := range m.recs {
		if n == limit {
			break
		}
		last := r.UpdatedAt
		if r.Status == StatusProcessing {
			last = r.LeaseUntil
		}
		if !last.After(cut) {
			delete(m.recs, k)
			n++
		}
	}
	return n, nil
}
