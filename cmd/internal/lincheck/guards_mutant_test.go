package lincheck_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/lincheck"
	"github.com/idemkit/idem/lock"
	"github.com/idemkit/idem/token"
)

// TestCheckerCatchesBrokenLocksAndTokens: the lock and token models fail
// a backend with a planted defect.
func TestCheckerCatchesBrokenLocksAndTokens(t *testing.T) {
	for _, bug := range []string{"two-holders", "fence-reused", "extend-after-takeover"} {
		t.Run("lock/"+bug, func(t *testing.T) {
			h, _ := lincheck.RunLocks(context.Background(), &buggyLocks{bug: bug, locks: map[string]*buggyLock{}}, lincheck.LockWorkload{})
			if h.Linearizable(lincheck.LockModel(margin)) {
				t.Errorf("the checker passed a lock backend whose %s", bug)
			}
		})
	}
	t.Run("token/spent-twice", func(t *testing.T) {
		h, _ := lincheck.RunTokens(context.Background(), spentTwice{token.NewMemoryStore()}, lincheck.TokenWorkload{})
		if h.Linearizable(lincheck.TokenModel(margin, false)) {
			t.Error("the checker passed a token store that lets a token be spent twice")
		}
	})
}

type buggyLock struct {
	owner string
	fence int64
	until time.Time
	held  bool
}

type buggyLocks struct {
	bug   string
	mu    sync.Mutex
	locks map[string]*buggyLock
}

func (b *buggyLocks) Acquire(_ context.Context, name, owner string, ttl time.Duration) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	l, ok := b.locks[name]
	if !ok {
		l = &buggyLock{}
		b.locks[name] = l
	}
	now := time.Now()
	if l.held && now.Before(l.until) && b.bug != "two-holders" {
		return 0, lock.ErrHeld
	}
	if b.bug != "fence-reused" || l.fence == 0 {
		l.fence++
	}
	l.owner, l.until, l.held = owner, now.Add(ttl), true
	return l.fence, nil
}

func (b *buggyLocks) Extend(_ context.Context, name, owner string, fence int64, ttl time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	l, ok := b.locks[name]
	if !ok || !l.held || (l.owner != owner || l.fence != fence) && b.bug != "extend-after-takeover" || time.Now().After(l.until) {
		return lock.ErrNotHeld
	}
	l.until = time.Now().Add(ttl)
	return nil
}

func (b *buggyLocks) Release(_ context.Context, name, owner string, fence int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	l, ok := b.locks[name]
	if !ok || !l.held || l.owner != owner || l.fence != fence {
		return lock.ErrNotHeld
	}
	l.held = false
	return nil
}

// spentTwice answers a second use as a first one.
type spentTwice struct{ token.Store }

func (s spentTwice) Consume(ctx context.Context, scope, digest string, sp token.Spend) error {
	var used *token.UsedError
	if err := s.Store.Consume(ctx, scope, digest, sp); err != nil && !errors.As(err, &used) {
		return err
	}
	return nil
}
