package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/rediskey"
)

// InboxConfig configures an InboxStore. A nil InboxConfig, and the zero
// value of each field, mean the default.
type InboxConfig struct {
	// Prefix starts the name of every key the store writes
	// ("PREFIX:inbox:LEN:GROUP:ID", LEN the group's length in bytes).
	// Rules as TokenConfig.Prefix. Default DefaultPrefix ("idem").
	Prefix string
	// Retention is how long a succeeded or dead record is kept (its key's
	// TTL): a duplicate delivered later is handled again. Keep it longer
	// than the broker may redeliver. Default DefaultInboxRetention (7 days).
	Retention time.Duration
}

// DefaultInboxRetention is InboxConfig.Retention's default.
const DefaultInboxRetention = 7 * 24 * time.Hour

var (
	//go:embed inbox_claim.lua
	inboxClaimLua string
	//go:embed inbox_end.lua
	inboxEndLua string
	//go:embed inbox_get.lua
	inboxGetLua string
	//go:embed inbox_sweep.lua
	inboxSweepLua string

	inboxClaimScript = redis.NewScript(libLua + inboxClaimLua)
	inboxEndScript   = redis.NewScript(libLua + inboxEndLua)
	inboxGetScript   = redis.NewScript(inboxGetLua)
	inboxSweepScript = redis.NewScript(libLua + inboxSweepLua)
)

// InboxStore is an [inbox.Store] on Redis, for Inbox.Handle (effects
// outside a database): one hash per consume record, under
// PREFIX:inbox:LEN:GROUP:ID. Every operation is one Lua script, atomic
// on the server, with times from the server's clock (TIME). A succeeded
// or dead record expires after the retention; a processing or failed
// record has no TTL, so no volatile-* eviction policy drops it, and Sweep
// removes it once it is old (see Sweep). It does not implement
// inbox.TxStore (no HandleTx).
//
// It is as durable as the server: a record Redis loses (a restart
// without persistence, a failover that drops the last writes, eviction)
// makes a later duplicate run the handler again. Under an allkeys-*
// maxmemory policy any record may be evicted; under a volatile-* one the
// succeeded and dead records may (they have a TTL), and a duplicate of a
// message whose succeeded record was evicted runs its effect again, a
// dead message's its attempts again. Run it on a server with the
// noeviction policy for the guarantee to hold. It works on a
// single server, a Sentinel-managed primary or a Redis Cluster (one key
// per record).
type InboxStore struct {
	client    redis.Scripter
	prefix    string
	retention int64
}

var _ inbox.Store = (*InboxStore)(nil)

// NewInboxStore returns an InboxStore over client. A nil cfg means
// defaults; cfg is copied. It sends nothing to the server.
func NewInboxStore(client redis.Scripter, cfg *InboxConfig) (*InboxStore, error) {
	if client == nil {
		return nil, errors.New("redisstore: NewInboxStore needs a client")
	}
	var c InboxConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if err := rediskey.ValidatePrefix("redisstore", c.Prefix); err != nil {
		return nil, err
	}
	switch {
	case c.Retention == 0:
		c.Retention = DefaultInboxRetention
	case c.Retention < time.Millisecond:
		return nil, fmt.Errorf("redisstore: NewInboxStore: retention %v", c.Retention)
	}
	return &InboxStore{client: client, prefix: c.Prefix, retention: millis(c.Retention)}, nil
}

func (s *InboxStore) key(group, id string) string {
	return s.prefix + ":inbox:" + strconv.Itoa(len(group)) + ":" + group + ":" + id
}

// Claim takes the record for a new attempt; see [inbox.Store].
func (s *InboxStore) Claim(ctx context.Context, group, id string, lease time.Duration, maxAttempts int) (inbox.Claim, error) {
	if lease <= 0 {
		return inbox.Claim{}, fmt.Errorf("redisstore: inbox claim: lease %v is not positive", lease)
	}
	r, err := inboxClaimScript.Run(ctx, s.client, []string{s.key(group, id)}, millis(lease), maxAttempts, s.retention).Slice()
	if err != nil {
		return inbox.Claim{}, fmt.Errorf("redisstore: inbox claim: %w", err)
	}
	if len(r) != 6 {
		return inbox.Claim{}, fmt.Errorf("redisstore: inbox claim: %d values in the reply", len(r))
	}
	n := make([]int64, 6)
	for _, i := range []int{0, 2, 3, 4, 5} {
		v, ok := r[i].(int64)
		if !ok {
			return inbox.Claim{}, fmt.Errorf("redisstore: inbox claim: reply %d is %T", i, r[i])
		}
		n[i] = v
	}
	st, _ := r[1].(string)
	return inbox.Claim{Claimed: n[0] == 1, Status: inbox.Status(st), Attempts: int(n[2]), Fence: n[3],
		LeaseUntil: time.UnixMilli(n[4]).UTC(), Now: time.UnixMilli(n[5]).UTC()}, nil
}

// end runs inbox_end.lua.
func (s *InboxStore) end(ctx context.Context, op, group, id string, fence int64, args ...any) (inbox.Status, error) {
	r, err := inboxEndScript.Run(ctx, s.client, []string{s.key(group, id)}, append([]any{fence, op}, args...)...).Result()
	if err != nil {
		return "", fmt.Errorf("redisstore: inbox %s: %w", op, err)
	}
	st, ok := r.(string)
	if !ok {
		return "", inbox.ErrFenced
	}
	return inbox.Status(st), nil
}

// Finish marks the record succeeded; see [inbox.Store].
func (s *InboxStore) Finish(ctx context.Context, group, id string, fence int64) error {
	_, err := s.end(ctx, "finish", group, id, fence, s.retention)
	return err
}

// Fail ends a failed attempt; see [inbox.Store].
func (s *InboxStore) Fail(ctx context.Context, group, id string, fence int64, maxAttempts int, reason string) (inbox.Status, error) {
	if len(reason) > inbox.MaxReasonLen {
		reason = strings.ToValidUTF8(reason[:inbox.MaxReasonLen], "")
	}
	return s.end(ctx, "fail", group, id, fence, maxAttempts, reason, s.retention)
}

// Extend extends a live lease; see [inbox.Store].
func (s *InboxStore) Extend(ctx context.Context, group, id string, fence int64, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("redisstore: inbox extend: lease %v is not positive", lease)
	}
	_, err := s.end(ctx, "extend", group, id, fence, millis(lease))
	return err
}

// Get returns the record; see [inbox.Store].
func (s *InboxStore) Get(ctx context.Context, group, id string) (inbox.Record, error) {
	r, err := inboxGetScript.Run(ctx, s.client, []string{s.key(group, id)}).Slice()
	if err != nil {
		return inbox.Record{}, fmt.Errorf("redisstore: inbox get: %w", err)
	}
	if len(r) != 7 || r[0] == nil {
		return inbox.Record{}, inbox.ErrNotFound
	}
	str := func(i int) string { v, _ := r[i].(string); return v }
	num := func(i int) int64 { v, _ := strconv.ParseInt(str(i), 10, 64); return v }
	ms := func(i int) time.Time { return time.UnixMilli(num(i)).UTC() }
	return inbox.Record{Group: group, ID: id, Status: inbox.Status(str(0)), Attempts: int(num(1)), Fence: num(2),
		LeaseUntil: ms(3), LastError: str(4), CreatedAt: ms(5), UpdatedAt: ms(6)}, nil
}

// Sweep removes up to limit records that no delivery works on any more;
// see [inbox.Store]: succeeded, failed and dead records last updated more
// than retention ago, and processing ones whose lease ended more than
// retention ago. Succeeded and dead records also expire by themselves
// (InboxConfig.Retention); failed and processing ones have no TTL and
// only Sweep removes them, so call it now and then. It walks the
// keyspace like [Store.Sweep]: SCAN over the store's inbox keys (on every
// master of a cluster, every shard of a ring), a pipelined HMGET per
// batch, and inbox_sweep.lua on the old ones, which checks again and
// deletes each atomically; its cost grows with the number of keys on the
// server. The client must be able to SCAN (every go-redis client can).
func (s *InboxStore) Sweep(ctx context.Context, retention time.Duration, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	c, ok := s.client.(nodeClient)
	if !ok {
		return 0, fmt.Errorf("redisstore: inbox sweep: the client (%T) cannot SCAN", s.client)
	}
	if limit <= 0 {
		limit = inbox.DefaultSweepLimit
	}
	ret := millis(retention)
	n, err := sweep(ctx, c, scanSweep{
		match:  escapeGlob(s.prefix) + ":inbox:*",
		fields: []string{"s", "l", "u"},
		due: func(nowMS int64, v []any) bool {
			last := parseMS(v[2])
			if v[0] == string(inbox.StatusProcessing) {
				last = parseMS(v[1])
			}
			return v[0] != nil && last >= 0 && last <= nowMS-ret
		},
		script: inboxSweepScript,
		args:   []any{ret},
	}, limit)
	if err != nil {
		return n, fmt.Errorf("redisstore: inbox sweep: %w", err)
	}
	return n, nil
}
