package redisstore

import (
	"context"
	_ "embed"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/internal/rediskey"
	"github.com/idemkit/idem/lock"
)

var (
	//go:embed lock_acquire.lua
	lockAcquireLua string
	//go:embed lock_extend.lua
	lockExtendLua string
	//go:embed lock_release.lua
	lockReleaseLua string

	lockAcquireScript = redis.NewScript(libLua + lockAcquireLua)
	lockExtendScript  = redis.NewScript(libLua + lockExtendLua)
	lockReleaseScript = redis.NewScript(libLua + lockReleaseLua)
)

// LockConfig configures a LockBackend. A nil LockConfig, and the zero
// value of each field, mean the default.
type LockConfig struct {
	// Prefix starts the name of every key the backend writes
	// ("PREFIX:lock:{…}"). It may not contain '{', '}', spaces or control
	// characters, and is at most 64 bytes. Default "idem".
	Prefix string
}

// LockBackend is a [lock.Backend] on Redis: one Lua script per
// operation, one round trip each. A lock is the hash
//
//	PREFIX:lock:{B64(name)}
//
// holding its owner (o), fence (f) and the end of its lease (u, unix
// milliseconds on the server's clock, TIME), with no TTL: Redis does not
// evict it under a volatile-* maxmemory policy (the default of several
// managed services), which evicts only keys with a TTL and would
// otherwise hand a held lock to a second owner. Its fence comes from the
// counter key
//
//	PREFIX:lock:{B64(name)}:fence
//
// (INCR, no TTL), in the same Redis Cluster slot (B64 is unpadded
// base64url, so braces in a name cannot change the hash tag). Release
// deletes the lock and keeps the counter; a lock whose lease ended
// without Release stays until the next Acquire of its name.
//
// It is an efficiency lock. The counter lives on one node: a failover to
// a replica that had not received the last INCR, a restart without
// persistence, or the eviction of the counter (maxmemory-policy
// allkeys-*) hands a fence out again, and a lock itself can be lost the
// same ways while its holder believes it holds it. Use it to keep
// instances from doing the same work twice; where a duplicate would be
// wrong, use sqlstore's LockBackend, whose fence lives in the database.
// The counters are never deleted: lock names should come from a bounded
// set.
type LockBackend struct {
	client redis.Scripter
	prefix string
}

var _ lock.Backend = (*LockBackend)(nil)

// NewLockBackend returns a LockBackend over client (any go-redis client:
// *redis.Client, *redis.ClusterClient, a redis.UniversalClient). A nil
// cfg means defaults. It does not touch the server.
func NewLockBackend(client redis.Scripter, cfg *LockConfig) (*LockBackend, error) {
	if client == nil {
		return nil, errors.New("redisstore: NewLockBackend needs a client")
	}
	var c LockConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if err := rediskey.ValidatePrefix("redisstore", c.Prefix); err != nil {
		return nil, err
	}
	return &LockBackend{client: client, prefix: c.Prefix}, nil
}

// LockKeys returns the names of the lock's key and of its fence
// counter.
func (b *LockBackend) LockKeys(name string) (lockKey, fenceKey string) {
	k := b.prefix + ":lock:{" + base64.RawURLEncoding.EncodeToString([]byte(name)) + "}"
	return k, k + ":fence"
}

func (b *LockBackend) fail(ctx context.Context, op, name string, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("redisstore: lock %s %q: %w (%v)", op, name, cerr, err)
	}
	if errors.Is(err, redis.Nil) {
		err = errors.New("unexpected nil reply")
	}
	return fmt.Errorf("redisstore: lock %s %q: %w", op, name, err)
}

// Acquire implements lock.Backend.
func (b *LockBackend) Acquire(ctx context.Context, name, owner string, ttl time.Duration) (int64, error) {
	if err := lock.ValidateName(name); err != nil {
		return 0, err
	}
	if owner == "" || ttl <= 0 {
		return 0, fmt.Errorf("redisstore: lock acquire %q: empty owner or TTL %v", name, ttl)
	}
	k, f := b.LockKeys(name)
	fence, err := lockAcquireScript.Run(ctx, b.client, []string{k, f}, owner, millis(ttl)).Int64()
	if err != nil {
		return 0, b.fail(ctx, "acquire", name, err)
	}
	if fence == 0 {
		return 0, lock.ErrHeld
	}
	return fence, nil
}

// Extend implements lock.Backend.
func (b *LockBackend) Extend(ctx context.Context, name, owner string, fence int64, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("redisstore: lock extend %q: TTL %v", name, ttl)
	}
	k, _ := b.LockKeys(name)
	return b.compare(ctx, "extend", name, lockExtendScript, k, owner, strconv.FormatInt(fence, 10), millis(ttl))
}

// Release implements lock.Backend.
func (b *LockBackend) Release(ctx context.Context, name, owner string, fence int64) error {
	k, _ := b.LockKeys(name)
	return b.compare(ctx, "release", name, lockReleaseScript, k, owner, strconv.FormatInt(fence, 10))
}

func (b *LockBackend) compare(ctx context.Context, op, name string, s *redis.Script, key string, args ...any) error {
	if owner := args[0].(string); owner == "" {
		return lock.ErrNotHeld
	}
	ok, err := s.Run(ctx, b.client, []string{key}, args...).Int64()
	if err != nil {
		return b.fail(ctx, op, name, err)
	}
	if ok == 0 {
		return lock.ErrNotHeld
	}
	return nil
}
