package redisstore

import (
	"context"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// scanCount is the COUNT hint of each SCAN call of Sweep.
const scanCount = 1000

// nodeClient is what Sweep needs of one node.
type nodeClient interface {
	ScanType(ctx context.Context, cursor uint64, match string, count int64, keyType string) *redis.ScanCmd
	Pipeline() redis.Pipeliner
}

// Sweep removes up to limit records whose ExpiresAt has passed (limit <= 0
// means idem.DefaultSweepLimit) and returns how many it removed. It never
// removes a processing record whose lease is live.
//
// Redis deletes a completed record itself, Config.Grace after its
// ExpiresAt, so for those Sweep only removes them sooner. A processing
// record has no TTL (it must not be evictable): one whose process died is
// removed only by Sweep, once its lease ended more than its retention ago
// (its ExpiresAt), or replaced by an Acquire of its key. It walks the
// keyspace: SCAN over the keys of the store's prefix (on every master of a
// cluster, every shard of a ring, concurrently), one pipelined HMGET per
// SCAN batch to find the expired records, and one pipelined run of
// sweep.lua over those, which re-checks and deletes each atomically. Its
// cost grows with the number of keys on the server, not with the number
// of expired records.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if limit <= 0 {
		limit = idem.DefaultSweepLimit
	}
	removed, err := sweep(ctx, s.client, s.recordSweep(), limit)
	if err != nil {
		return removed, s.fail(ctx, "sweep", err)
	}
	if removed > 0 {
		s.log.DebugContext(ctx, "redisstore: swept expired records", "removed", removed, "limit", limit)
	}
	return removed, nil
}

// scanSweep is what sweep looks for: the hashes whose names match
// match, of which due tells, from their fields and the node's clock, which
// script (its ARGV args) is to re-check and delete.
type scanSweep struct {
	match  string
	fields []string
	due    func(nowMS int64, v []any) bool
	script *redis.Script
	args   []any
}

// recordSweep finds the records whose expires_at has passed and that
// hold no live lease.
func (s *Store) recordSweep() scanSweep {
	return scanSweep{
		match:  escapeGlob(s.prefix) + ":{*",
		fields: []string{"status", "lease_until", "expires_at"},
		due: func(nowMS int64, v []any) bool {
			status, _ := v[0].(string)
			leaseUntil := parseMS(v[1])
			expiresAt := parseMS(v[2])
			if status == "" || expiresAt < 0 || nowMS < expiresAt {
				return false
			}
			return status != string(idem.StatusProcessing) || nowMS >= leaseUntil
		},
		script: sweepScript,
	}
}

// sweep removes up to limit of the hashes sw finds on the server of c,
// on every master of a cluster and every shard of a ring, concurrently.
func sweep(ctx context.Context, c nodeClient, sw scanSweep, limit int) (int, error) {
	b := &budget{left: limit}
	var err error
	switch c := c.(type) {
	case interface {
		ForEachMaster(context.Context, func(context.Context, *redis.Client) error) error
	}:
		err = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return sweepNode(ctx, n, sw, b) })
	case interface {
		ForEachShard(context.Context, func(context.Context, *redis.Client) error) error
	}:
		err = c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return sweepNode(ctx, n, sw, b) })
	default:
		err = sweepNode(ctx, c, sw, b)
	}
	return b.removed(), err
}

// budget shares a Sweep's limit among the nodes it visits.
type budget struct {
	mu        sync.Mutex
	left, got int
}

// reserve takes up to n removals from the budget.
func (b *budget) reserve(n int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n = min(n, b.left)
	b.left -= n
	return n
}

// settle records that removed of reserved removals happened and returns
// the rest to the budget.
func (b *budget) settle(reserved, removed int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.left += reserved - removed
	b.got += removed
}

func (b *budget) removed() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.got
}

func (b *budget) spent() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.left <= 0
}

// sweepNode sweeps the keys of one node.
func sweepNode(ctx context.Context, c nodeClient, sw scanSweep, b *budget) error {
	var cursor uint64
	for !b.spent() {
		keys, next, err := c.ScanType(ctx, cursor, sw.match, scanCount, "hash").Result()
		if err != nil {
			return err
		}
		due, err := dueKeys(ctx, c, sw, keys)
		if err != nil {
			return err
		}
		for len(due) > 0 {
			n := b.reserve(len(due))
			if n == 0 {
				return nil
			}
			removed, err := sweepKeys(ctx, c, sw, due[:n])
			b.settle(n, removed)
			if err != nil {
				return err
			}
			due = due[n:]
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
	return nil
}

// dueKeys returns the keys whose hash sw.due deems sweepable by the
// node's clock: one pipelined HMGET per key, with the node's TIME.
func dueKeys(ctx context.Context, c nodeClient, sw scanSweep, keys []string) ([]string, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	p := c.Pipeline()
	now := p.Time(ctx)
	cmds := make([]*redis.SliceCmd, len(keys))
	for i, k := range keys {
		cmds[i] = p.HMGet(ctx, k, sw.fields...)
	}
	if _, err := p.Exec(ctx); err != nil && !isMoved(err) {
		return nil, err
	}
	t, err := now.Result()
	if err != nil {
		return nil, err
	}
	nowMS := t.UnixMilli()
	var out []string
	for i, cmd := range cmds {
		v, err := cmd.Result()
		if err != nil || len(v) != len(sw.fields) { // MOVED: the slot left this node during the sweep
			continue
		}
		if sw.due(nowMS, v) {
			out = append(out, keys[i])
		}
	}
	return out, nil
}

// sweepKeys runs sw.script on each key, pipelined, and returns how many
// records it removed (the script answers 1 for a deleted key). A
// NOSCRIPT answer (the cache was flushed during the sweep) is met with
// EVAL.
func sweepKeys(ctx context.Context, c nodeClient, sw scanSweep, keys []string) (int, error) {
	p := c.Pipeline()
	cmds := make([]*redis.Cmd, len(keys))
	for i, k := range keys {
		cmds[i] = sw.script.EvalSha(ctx, p, []string{k}, sw.args...)
	}
	if _, err := p.Exec(ctx); err != nil && !isMoved(err) && !isNoScript(err) {
		return 0, err
	}
	removed := 0
	var retry []string
	for i, cmd := range cmds {
		n, err := cmd.Int()
		switch {
		case err == nil:
			removed += n
		case isNoScript(err):
			retry = append(retry, keys[i])
		}
	}
	if len(retry) > 0 {
		p := c.Pipeline()
		cmds := make([]*redis.Cmd, len(retry))
		for i, k := range retry {
			cmds[i] = sw.script.Eval(ctx, p, []string{k}, sw.args...)
		}
		if _, err := p.Exec(ctx); err != nil && !isMoved(err) {
			return removed, err
		}
		for _, cmd := range cmds {
			if n, err := cmd.Int(); err == nil {
				removed += n
			}
		}
	}
	return removed, nil
}

func isNoScript(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }

func isMoved(err error) bool {
	return redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK")
}

// parseMS parses a millisecond field of HMGET's reply; -1 if absent or
// malformed.
func parseMS(v any) int64 {
	s, ok := v.(string)
	if !ok {
		return -1
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return -1
	}
	return n
}
