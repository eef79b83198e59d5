package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/rediskey"
	"github.com/idemkit/idem/token"
)

// TokenConfig configures a TokenStore. A nil TokenConfig, and the zero
// value of each field, mean the default.
type TokenConfig struct {
	// Prefix starts the name of every key the store writes
	// ("PREFIX:token:{SCOPETAG}:DIGEST", "PREFIX:tokens:{SCOPETAG}:SCOPE"). It
	// may be a Store's prefix: token keys never meet record keys
	// ("PREFIX:{…}"), nor Store.Sweep. It may not
	// contain '{', '}', spaces or control characters, and is at most 64
	// bytes. Default DefaultPrefix ("idem").
	Prefix string
}

var (
	//go:embed token_insert.lua
	tokenInsertLua string
	//go:embed token_consume.lua
	tokenConsumeLua string
	//go:embed token_trim.lua
	tokenTrimLua string
)

var (
	tokenInsertScript  = redis.NewScript(libLua + tokenInsertLua)
	tokenConsumeScript = redis.NewScript(libLua + tokenConsumeLua)
	tokenTrimScript    = redis.NewScript(libLua + tokenTrimLua)
)

// TokenStore is a [token.Store] on Redis: the pre-issued submit tokens of
// package token, one hash per token under PREFIX:token:{SCOPETAG}:DIGEST
// (DIGEST is [token.Digest] of the ID, which is never stored; SCOPETAG a
// 16-hex-digit hash of the scope), and per scope a sorted set of its
// unused tokens, PREFIX:tokens:{SCOPETAG}:SCOPE (SCOPE in unpadded
// base64url), scored by expiry. Each
// operation is one Lua script, atomic on the server: Insert sets the
// scope and the key's expiry (the server's now + TTL) and adds the token
// to the set; Consume checks that the token exists, is of the caller's
// scope and is unused, marks it used with the result and the fingerprint,
// moves its expiry to now + Keep if that is later, and takes it out of
// the set; Trim drops the set's expired members and deletes the tokens
// beyond the newest it keeps. Redis deletes a token when its expiry
// comes, used or not, so Sweep has nothing to do.
//
// It is safe for concurrent use, and works on a single server, a
// Sentinel-managed primary or a Redis Cluster: the keys of one scope
// share a hash tag, and so a slot (Trim's script deletes token keys it
// finds in the set, in that slot). A digest is stored per scope: the same
// digest under two scopes is two tokens. Tokens stored under the key
// layout of earlier versions (PREFIX:token:DIGEST) are not found: after
// an upgrade, the forms open at the time answer token.ErrInvalid and must
// be reloaded. It is
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

// keys returns the keys of the token digest of scope and of the scope's
// set.
func (s *TokenStore) keys(scope, digest string) []string {
	return []string{rediskey.Token(s.prefix, scope, digest), rediskey.Tokens(s.prefix, scope)}
}

// Insert stores a new token; see [token.Store]. The key's expiry is the
// server's now + ttl, which Insert returns.
func (s *TokenStore) Insert(ctx context.Context, scope, digest string, ttl time.Duration) (time.Time, error) {
	if ttl <= 0 {
		return time.Time{}, fmt.Errorf("redisstore: token insert: ttl %v is not positive", ttl)
	}
	// The call's own token tells its insert from another's when go-redis
	// sends the script again after a lost reply.
	exp, err := tokenInsertScript.Run(ctx, s.client, s.keys(scope, digest), scope, millis(ttl), digest, idem.NewOwner()).Int64()
	if err != nil {
		return time.Time{}, fmt.Errorf("redisstore: token insert: %w", err)
	}
	if exp < 0 {
		return time.Time{}, token.ErrDuplicate
	}
	return time.UnixMilli(exp).UTC(), nil
}

// Consume spends a token; see [token.Store].
func (s *TokenStore) Consume(ctx context.Context, scope, digest string, sp token.Spend) error {
	if len(sp.Result) > token.MaxResultLen {
		return fmt.Errorf("%w: %d bytes", token.ErrResultTooLarge, len(sp.Result))
	}
	keep := int64(0)
	if sp.Keep > 0 {
		keep = millis(sp.Keep)
	}
	// use tells this call's use from another's when go-redis sends the
	// script again after a lost reply: the second run finds the token
	// spent by the first and must say "spent now", not "spent before".
	use := idem.NewOwner()
	reply, err := tokenConsumeScript.Run(ctx, s.client, s.keys(scope, digest), scope, sp.Result, sp.Fingerprint, keep, digest, use).Slice()
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
	case code == 2 && len(reply) == 4:
		at, _ := reply[1].(string)
		ms, err := strconv.ParseInt(at, 10, 64)
		if err != nil {
			return fmt.Errorf("redisstore: token consume: used_at %q: %w", at, err)
		}
		res, _ := reply[2].(string)
		fp, _ := reply[3].(string)
		ue := &token.UsedError{UsedAt: time.UnixMilli(ms).UTC(), Fingerprint: fp}
		if res != "" {
			ue.Result = []byte(res)
		}
		return ue
	}
	return fmt.Errorf("redisstore: token consume: unexpected reply %v", reply)
}

// Trim removes the unused tokens of scope but its keep newest live ones;
// see [token.Store]. One script on the scope's slot.
func (s *TokenStore) Trim(ctx context.Context, scope string, keep int) (int, error) {
	if keep < 0 {
		return 0, fmt.Errorf("redisstore: token trim: keep %d is negative", keep)
	}
	base := rediskey.Token(s.prefix, scope, "")
	n, err := tokenTrimScript.Run(ctx, s.client, []string{rediskey.Tokens(s.prefix, scope)}, keep, base, scope).Int64()
	if err != nil {
		return 0, fmt.Errorf("redisstore: token trim: %w", err)
	}
	return int(n), nil
}

// Sweep removes nothing and returns 0: Redis deletes each token when its
// TTL ends.
func (s *TokenStore) Sweep(ctx context.Context, limit int) (int, error) {
	return 0, ctx.Err()
}
