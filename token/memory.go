package token

import (
	"context"
	"slices"
	"sync"
	"time"
)

// MemoryStore is a Store in one process's memory: one mutex over a map.
// It keeps the whole Store contract (tokentest passes), so it serves tests,
// examples and services that run as a single instance. Its clock is the
// process's. Nothing survives a restart, and two instances of a service do
// not share tokens. It runs no goroutine: expired tokens stay in memory
// until Sweep removes them.
type MemoryStore struct {
	mu     sync.Mutex
	tokens map[string]*memToken
	now    func() time.Time
}

type memToken struct {
	scope     string
	expiresAt time.Time
	usedAt    time.Time // zero while unused
	result    []byte
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{tokens: map[string]*memToken{}, now: time.Now}
}

// Insert stores a new token; see Store.
func (m *MemoryStore) Insert(ctx context.Context, scope, digest string, ttl time.Duration) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.tokens[digest]; ok {
		return time.Time{}, ErrDuplicate
	}
	exp := m.now().Add(ttl).Round(0)
	m.tokens[digest] = &memToken{scope: scope, expiresAt: exp}
	return exp, nil
}

// Consume spends a token; see Store.
func (m *MemoryStore) Consume(ctx context.Context, scope, digest string, result []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	t, ok := m.tokens[digest]
	if !ok || t.scope != scope || !now.Before(t.expiresAt) {
		return ErrInvalid
	}
	if !t.usedAt.IsZero() {
		return &UsedError{UsedAt: t.usedAt, Result: slices.Clone(t.result)}
	}
	t.usedAt = now.Round(0)
	if len(result) > 0 {
		t.result = slices.Clone(result)
	}
	return nil
}

// Sweep removes expired tokens; see Store.
func (m *MemoryStore) Sweep(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if limit <= 0 {
		limit = DefaultSweepLimit
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	n := 0
	for d, t := range m.tokens {
		if n == limit {
			break
		}
		if !now.Before(t.expiresAt) {
			delete(m.tokens, d)
			n++
		}
	}
	return n, nil
}
