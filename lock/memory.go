package lock

import (
	"context"
	"sync"
	"time"
)

// MemoryBackend is a Backend in the process's memory, for tests and for
// programs that run as one instance. Its clock is the process's
// monotonic clock. It keeps a small entry per name ever acquired (the
// fence must survive release and expiry), so it suits a bounded set of
// names. The zero value is ready to use; it is safe for concurrent use.
type MemoryBackend struct {
	mu    sync.Mutex
	locks map[string]*memoryLock
}

type memoryLock struct {
	owner string // "" when free
	fence int64
	until time.Time
}

var _ Backend = (*MemoryBackend)(nil)

// NewMemoryBackend returns an empty MemoryBackend.
func NewMemoryBackend() *MemoryBackend { return &MemoryBackend{} }

// held returns name's lock if owner holds it at now with fence. mu held.
func (m *MemoryBackend) held(name, owner string, fence int64, now time.Time) *memoryLock {
	lk := m.locks[name]
	if lk == nil || lk.owner == "" || lk.owner != owner || lk.fence != fence || !now.Before(lk.until) {
		return nil
	}
	return lk
}

// Acquire implements Backend.
func (m *MemoryBackend) Acquire(ctx context.Context, name, owner string, ttl time.Duration) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.locks == nil {
		m.locks = map[string]*memoryLock{}
	}
	lk := m.locks[name]
	if lk == nil {
		lk = &memoryLock{}
		m.locks[name] = lk
	}
	if lk.owner != "" && now.Before(lk.until) {
		return 0, ErrHeld
	}
	lk.owner, lk.until = owner, now.Add(ttl)
	lk.fence++
	return lk.fence, nil
}

// Extend implements Backend.
func (m *MemoryBackend) Extend(ctx context.Context, name, owner string, fence int64, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	lk := m.held(name, owner, fence, now)
	if lk == nil {
		return ErrNotHeld
	}
	lk.until = now.Add(ttl)
	return nil
}

// Release implements Backend.
func (m *MemoryBackend) Release(ctx context.Context, name, owner string, fence int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	lk := m.held(name, owner, fence, now)
	if lk == nil {
		return ErrNotHeld
	}
	lk.owner, lk.until = "", time.Time{}
	return nil
}
