package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/internal/rediskey"
	"github.com/idemkit/idem/token"
)

// TokenConfig configures a TokenStore. A nil TokenConfig, and the zero
// value of each field, mean the default.
type TokenConfig struct {
	// Prefix starts the name of every key the store writes
	// ("PREFIX:token:DIGEST"). It may be a Store's prefix: token keys
	// never meet record keys ("PREFIX:{…}"), nor Store.Sweep. It may not
	// contain '{', '}', spaces or control characters, and is at most 64
	// bytes. Default DefaultPrefix ("idem").
	Prefix string
}

var (
	//go:embed token_insert.lua
	tokenInsertLua string
	//go:embed token_consume.lua
	tokenConsumeLua string
)

var (
	tokenInsertScript  = redis.NewScript(libLua + tokenInsertLua)
	tokenConsumeScript = redis.NewScript(libLua + tokenConsumeLua)
)

// TokenStore is a [token.Store] on Redis: the pre-issued submit tokens of
// package token, one hash per token under PREFIX:token:DIGEST (DIGEST is
// [token.Digest] of the ID; the ID is never stored). Each operation is one
// Lua script, atomic on the server: Insert sets the scope and the key's
// expiry (the server's now + TTL); Consume checks that the token exists,
// is of the caller's scope and is unused, and marks it used with the
// result, keeping its expiry. Redis deletes a token when its TTL ends,
// used or not, so Sweep has nothing to do.
//
// It is safe for concurrent use, and works on a single server, a
// Sentinel-managed primary or a Redis Cluster (one key per token). It is
// as durable as the server: a token that Redis loses (a restart without
// persistence, a failover that drops the last writes, an eviction under
// maxmemory) answers token.ErrInvalid — never nil — so a used token
// lost that way refuses its repeat without its result, and an unused one
// refuses its first use. It does not implement token.TxStore.
type TokenStore struct {
	client redis.Scripter
	prefix string
}

var _ token.Store = (*TokenStore)(nil)

// NewTokenStore returns a TokenStore over client (a *redis.Client,
// *redis.ClusterClient, or any redis.Scripter). A nil cfg means defaults;
// cfg is copied. NewTokenStore sends nothing to the server.
func NewTokenStore(client redis.Scripter, cfg *TokenConfig) (*TokenStore, error) {
	if client == nil {
		return nil, errors.New("redisstore: NewTokenStore needs a client")
	}
	var c TokenConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if err := rediskey.ValidatePrefix("redisstore", c.Prefix); err != nil {
		return nil, err
	}
	return &TokenStore{client: client, prefix: c.Prefix}, nil
}

func (s *TokenStore) key(digest string) string { return s.prefix + ":token:" + digest }

// Insert stores a new token; see [token.Store]. The key's expiry is the
// server's now + ttl, which Insert returns.
func (s *TokenStore) Insert(ctx context.Context, scope, digest string, ttl time.Duration) (time.Time, error) {
	if ttl <= 0 {
		return time.Time{}, fmt.Errorf("redisstore: token insert: ttl %v is not positive", ttl)
	}
	exp, err := tokenInsertScript.Run(ctx, s.client, []string{s.key(digest)}, scope, millis(ttl)).Int64()
	if err != nil {
		return time.Time{}, fmt.Errorf("redisstore: token insert: %w", err)
	}
	if exp < 0 {
		return time.Time{}, token.ErrDuplicate
	}
	return time.UnixMilli(exp).UTC(), nil
}

// Consume spends a token; see [token.Store].
func (s *TokenStore) Consume(ctx context.Context, scope, digest string, result []byte) error {
	if len(result) > token.MaxResultLen {
		return fmt.Errorf("%w: %d bytes", token.ErrResultTooLarge, len(result))
	}
	reply, err := tokenConsumeScript.Run(ctx, s.client, []string{s.key(digest)}, scope, result).Slice()
	if err != nil {
		return fmt.Errorf("redisstore: token consume: %w", err)
	}
	code, ok := reply[0].(int64)
	switch {
	case !ok:
		return fmt.Errorf("redisstore: token consume: unexpected reply %v", reply)
	case code == 0:
		return token.ErrInvalid
	case code == 1:
		return nil
	case code == 2 && len(reply) == 3:
		at, _ := reply[1].(string)
		ms, err := strconv.ParseInt(at, 10, 64)
		if err != nil {
			return fmt.Errorf("redisstore: token consume: used_at %q: %w", at, err)
		}
		res, _ := reply[2].(string)
		ue := &token.UsedError{UsedAt: time.UnixMilli(ms).UTC()}
		if res != "" {
			ue.Result = []byte(res)
		}
		return ue
	}
	return fmt.Errorf("redisstore: token consume: unexpected reply %v", reply)
}

// Sweep removes nothing and returns 0: Redis deletes each token when its
// TTL ends.
func (s *TokenStore) Sweep(ctx context.Context, limit int) (int, error) {
	return 0, ctx.Err()
}
