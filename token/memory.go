package token

import (
	"context"
	"slices"
	"strings"
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
	unused map[string]map[string]*memToken // scope → digest → its unused tokens, for Trim
	now    func() time.Time
}

type memToken struct {
	scope       string
	expiresAt   time.Time
	usedAt      time.Time // zero while unused
	result      []byte
	fingerprint string
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{tokens: map[string]*memToken{}, unused: map[string]map[string]*memToken{}, now: time.Now}
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
	t := &memToken{scope: scope, expiresAt: exp}
	m.tokens[digest] = t
	if m.unused[scope] == nil {
		m.unused[scope] = map[string]*memToken{}
	}
	m.unused[scope][digest] = t
	return exp, nil
}

// Consume spends a token; see Store.
func (m *MemoryStore) Consume(ctx context.Context, scope, digest string, s Spend) error {
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
		return &UsedError{UsedAt: t.usedAt, Result: slices.Clone(t.result), Fingerprint: t.fingerprint}
	}
	t.usedAt = now.Round(0)
	if len(s.Result) > 0 {
		t.result = slices.Clone(s.Result)
	}
	t.fingerprint = s.Fingerprint
	if keep := t.usedAt.Add(s.Keep); keep.After(t.expiresAt) {
		t.expiresAt = keep
	}
	m.forget(scope, digest)
	return nil
}

// forget drops digest from the unused tokens of scope.
func (m *MemoryStore) forget(scope, digest string) {
	delete(m.unused[scope], digest)
	if len(m.unused[scope]) == 0 {
		delete(m.unused, scope)
	}
}

// Trim removes a scope's unused tokens beyond its keep newest live ones;
// see Store.
func (m *MemoryStore) Trim(ctx context.Context, scope string, keep int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	type entry struct {
		digest string
		exp    time.Time
	}
	var live []entry
	n := 0
	for d, t := range m.unused[scope] {
		if !now.Before(t.expiresAt) {
			delete(m.tokens, d)
			m.forget(scope, d)
			n++
			continue
		}
		live = append(live, entry{d, t.expiresAt})
	}
	if len(live) <= keep {
		return n, nil
	}
	slices.SortFunc(live, func(a, b entry) int { // newest first
		if c := b.exp.Compare(a.exp); c != 0 {
			return c
		}
		return strings.Compare(b.digest, a.digest)
	})
	for _, e := range live[keep:] {
		delete(m.tokens, e.digest)
		m.forget(scope, e.digest)
		n++
	}
	return n, nil
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
			if t.usedAt.IsZero() {
				m.forget(t.scope, d)
			}
			n++
		}
	}
	return n, nil
}
