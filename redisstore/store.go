package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/rediskey"
)

// Defaults of Config.
const (
	// DefaultPrefix starts the name of every Redis key the store writes.
	DefaultPrefix = "idem"
	// DefaultGrace is how long Redis keeps a completed record past its
	// ExpiresAt.
	DefaultGrace = time.Minute
	// DefaultWaitTimeout bounds each WAIT when Config.WaitReplicas is
	// positive.
	DefaultWaitTimeout = time.Second
)

// ErrNotReplicated means that a write reached the primary but fewer
// replicas than Config.WaitReplicas acknowledged it within
// Config.WaitTimeout: a failover may still lose it. Errors wrap it;
// test with errors.Is.
var ErrNotReplicated = errors.New("redisstore: not acknowledged by enough replicas")

// Config configures a Store. A nil Config, and the zero value of each
// field, mean the default.
type Config struct {
	// Prefix starts the name of every key the store writes ("PREFIX:{…}").
	// Two stores with different prefixes share nothing, and Sweep sees only
	// its own prefix. It may not contain '{', '}', spaces or control
	// characters, and is at most 64 bytes. Default "idem".
	Prefix string
	// Grace is how long Redis keeps a completed record past its ExpiresAt
	// before the key's TTL deletes it (a processing record has no TTL; see
	// the package doc). During the grace the record is still visible to
	// Get, Sweep removes it, and an Acquire that replaces it continues its
	// fence (old fence + 1). Default DefaultGrace (1 min); a negative value
	// means none: the TTL ends at ExpiresAt, and a record replaced after
	// Redis deleted it starts again at fence 1.
	Grace time.Duration
	// AllowAllKeysEviction lets New accept a server whose
	// maxmemory-policy is one of allkeys-* (allkeys-lru, allkeys-lfu,
	// allkeys-random). Such a server, once full, may evict any key, a
	// processing record included: a duplicate request then runs its effect
	// again. By default New refuses it; with AllowAllKeysEviction it logs a
	// warning and goes on. Default false.
	AllowAllKeysEviction bool
	// WaitReplicas, when positive, makes Acquire, Complete and Extend
	// send Redis' WAIT after their script, on the same connection and in
	// the same round trip (a pipeline), and succeed only once that many
	// replicas have acknowledged every write the connection made: a
	// failover that promotes one of them keeps the record. When fewer
	// acknowledge within WaitTimeout the call fails with an error
	// wrapping ErrNotReplicated (the guard answers 503, or keeps the
	// execution open for a retried Complete); an Acquire that had taken
	// the lease releases it first, best effort. The write is not undone
	// on the primary: WAIT only reports how far it got. Release, Delete,
	// DeleteIf and Sweep do not wait (losing one of them in a failover
	// brings back a record, never runs an effect twice). It needs a
	// *redis.Client (a single server, or a Sentinel primary from
	// redis.NewFailoverClient) or a *redis.ClusterClient; New refuses
	// other clients. Default 0: no WAIT, replication is asynchronous and
	// a failover may lose an acknowledged record (see the package doc).
	WaitReplicas int
	// WaitTimeout bounds each WAIT when WaitReplicas is positive. Keep it
	// below the client's ReadTimeout (go-redis' default 3 s), which
	// bounds the pipeline's answer. It is rounded up to a whole
	// millisecond (WAIT's unit). Default DefaultWaitTimeout (1 s);
	// negative is refused.
	WaitTimeout time.Duration
	// Logger receives New's messages about the server's maxmemory-policy
	// (a warning when AllowAllKeysEviction accepts allkeys-*, info when the
	// policy cannot be read) and Sweep's debug messages. Nil discards them.
	Logger *slog.Logger
}

// Client is what a Store needs of a go-redis client. *redis.Client,
// *redis.ClusterClient, *redis.Ring and every redis.UniversalClient
// implement it. A client that also has ForEachMaster (a cluster) or
// ForEachShard (a ring) is swept node by node; one that also has ConfigGet
// (every go-redis client) has its server's maxmemory-policy checked by
// New.
type Client interface {
	redis.Scripter
	HMGet(ctx context.Context, key string, fields ...string) *redis.SliceCmd
	Del(ctx context.Context, keys ...string) *redis.IntCmd
	ScanType(ctx context.Context, cursor uint64, match string, count int64, keyType string) *redis.ScanCmd
	Pipeline() redis.Pipeliner
}

var (
	//go:embed lib.lua
	libLua string
	//go:embed acquire.lua
	acquireLua string
	//go:embed complete.lua
	completeLua string
	//go:embed extend.lua
	extendLua string
	//go:embed release.lua
	releaseLua string
	//go:embed delete_if.lua
	deleteIfLua string
	//go:embed sweep.lua
	sweepLua string
)

// The scripts, each prefixed with lib.lua. Script.Run sends EVALSHA and,
// when the server answers NOSCRIPT (a restart, a failover, SCRIPT FLUSH),
// EVAL, which caches the script again.
var (
	acquireScript  = redis.NewScript(libLua + acquireLua)
	completeScript = redis.NewScript(libLua + completeLua)
	extendScript   = redis.NewScript(libLua + extendLua)
	releaseScript  = redis.NewScript(libLua + releaseLua)
	deleteIfScript = redis.NewScript(libLua + deleteIfLua)
	sweepScript    = redis.NewScript(libLua + sweepLua)
)

// Store is an idem.Store on Redis (a single server, a Sentinel-managed
// primary, or a Redis Cluster). It is safe for concurrent use. It does not
// implement idem.TxCompleter; it implements idem.ConditionalDeleter.
//
// A Store holds nothing of its own to release (no connection, goroutine or
// server-side state beyond the records), so it has no Close: the client is
// the caller's, and the caller closes it when no Store uses it any more.
type Store struct {
	client  Client
	prefix  string
	graceMS int64
	log     *slog.Logger
	// waitN and waitTimeout are Config.WaitReplicas and WaitTimeout;
	// primary finds the *redis.Client that holds a key when waitN > 0.
	waitN       int
	waitTimeout time.Duration
	primary     func(ctx context.Context, key string) (*redis.Client, error)
}

var (
	_ idem.Store              = (*Store)(nil)
	_ idem.ConditionalDeleter = (*Store)(nil)
	_ Client                  = redis.UniversalClient(nil)
)

// New returns a Store over client. A nil cfg means defaults; cfg is
// copied.
//
// New sends one command to the server, CONFIG GET maxmemory-policy (to
// every master of a cluster, every shard of a ring), waits for the
// answers at most a few seconds (whatever the client's timeouts: a call
// that outlives the wait ends with the client's own read timeout or
// Close), and refuses a server whose policy is allkeys-* (a cluster with
// one such master) unless cfg.AllowAllKeysEviction is set: such a server
// may evict a live lease. noeviction and volatile-* are accepted. Where the
// policy cannot be read (CONFIG disabled or denied, as on several managed
// services; the server unreachable; a client without ConfigGet) New logs
// it at info level and goes on. The policy is read once: a server
// reconfigured later is not checked again.
func New(client Client, cfg *Config) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: New needs a client")
	}
	var c Config
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
	case c.Grace == 0:
		c.Grace = DefaultGrace
	case c.Grace < 0:
		c.Grace = 0
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Store{client: client, prefix: c.Prefix, graceMS: millis(c.Grace), log: c.Logger}
	if err := s.configureWait(c.WaitReplicas, c.WaitTimeout); err != nil {
		return nil, err
	}
	if err := s.checkEviction(c.AllowAllKeysEviction); err != nil {
		return nil, err
	}
	return s, nil
}

// policyTimeout bounds New's CONFIG GET.
const policyTimeout = 3 * time.Second

// configGetter is a client that can read a server's configuration.
type configGetter interface {
	ConfigGet(ctx context.Context, parameter string) *redis.MapStringStringCmd
}

// nodePolicy is the maxmemory-policy of one server, or why it could not be
// read.
type nodePolicy struct {
	policy string
	err    error
}

// readPolicies reads the maxmemory-policy of every master of a cluster
// (every shard of a ring), or of the one server of any other client.
func (s *Store) readPolicies(ctx context.Context) ([]nodePolicy, error) {
	var (
		mu       sync.Mutex
		policies []nodePolicy
	)
	read := func(ctx context.Context, n configGetter) error {
		m, err := n.ConfigGet(ctx, "maxmemory-policy").Result()
		mu.Lock()
		defer mu.Unlock()
		policies = append(policies, nodePolicy{m["maxmemory-policy"], err})
		return nil
	}
	var err error
	switch c := s.client.(type) {
	case interface {
		ForEachMaster(context.Context, func(context.Context, *redis.Client) error) error
	}:
		err = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return read(ctx, n) })
	case interface {
		ForEachShard(context.Context, func(context.Context, *redis.Client) error) error
	}:
		err = c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return read(ctx, n) })
	case configGetter:
		err = read(ctx, c)
	default:
		return nil, errors.New("the client has no ConfigGet")
	}
	mu.Lock()
	defer mu.Unlock()
	return policies, err
}

// checkEviction reads the maxmemory-policy of the server (of every master
// of a cluster) and refuses allkeys-* unless allowAllKeys; see New.
func (s *Store) checkEviction(allowAllKeys bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), policyTimeout)
	defer cancel()
	// go-redis honours the context's deadline only with the client's
	// ContextTimeoutEnabled; otherwise a server that never answers holds
	// the call for the client's read timeout, or for ever. So New waits for
	// the answers no longer than policyTimeout: a call that outlives it
	// ends when the client's own timeout or Close ends it.
	type answer struct {
		policies []nodePolicy
		err      error
	}
	ch := make(chan answer, 1)
	go func() {
		p, err := s.readPolicies(ctx)
		ch <- answer{p, err}
	}()
	var a answer
	select {
	case a = <-ch:
	case <-ctx.Done():
		a.err = ctx.Err()
	}
	if a.err != nil {
		s.log.InfoContext(ctx, "redisstore: cannot read the server's maxmemory-policy; it must be noeviction or volatile-*", "error", a.err)
		return nil
	}
	for _, p := range a.policies {
		policy := p.policy
		switch {
		case p.err != nil:
			s.log.InfoContext(ctx, "redisstore: cannot read the server's maxmemory-policy; it must be noeviction or volatile-*", "error", p.err)
		case policy == "noeviction":
		case strings.HasPrefix(policy, "volatile-"):
			s.log.DebugContext(ctx, "redisstore: the server may evict completed records before their retention ends; a retry of an evicted one runs again", "maxmemory-policy", policy)
		case strings.HasPrefix(policy, "allkeys-"):
			if !allowAllKeys {
				return fmt.Errorf("redisstore: the server's maxmemory-policy is %s, which may evict a processing record and let a duplicate request run its effect again: "+
					"set it to noeviction or a volatile-* policy, or accept the risk with Config.AllowAllKeysEviction", policy)
			}
			s.log.WarnContext(ctx, "redisstore: the server may evict processing records: a duplicate request may then run its effect again (accepted by Config.AllowAllKeysEviction)", "maxmemory-policy", policy)
		default:
			s.log.InfoContext(ctx, "redisstore: unknown maxmemory-policy; it must be noeviction or volatile-*", "maxmemory-policy", policy)
		}
	}
	return nil
}

// Acquire claims the lease on (req.Scope, req.Key); see idem.Store.
func (s *Store) Acquire(ctx context.Context, req idem.AcquireRequest) (idem.AcquireResult, error) {
	if err := ctx.Err(); err != nil {
		return idem.AcquireResult{}, err
	}
	if err := req.Validate(); err != nil {
		return idem.AcquireResult{}, err
	}
	owner := idem.NewOwner()
	key := s.recordKey(req.Scope, req.Key)
	cmd, short := s.run(ctx, acquireScript, key,
		string(req.Fingerprint), millis(req.Lease), millis(req.Retention), owner)
	v, err := cmd.Slice()
	if err != nil {
		return idem.AcquireResult{}, s.fail(ctx, "acquire", err)
	}
	res, err := decodeAcquire(v, req, owner)
	if err != nil {
		return idem.AcquireResult{}, fmt.Errorf("redisstore: acquire: %w", err)
	}
	if short != nil {
		if res.Outcome == idem.Acquired {
			// Nobody will use this lease: free the key for a retry rather
			// than leave it to the lease's end. Best effort: a release
			// lost in a failover brings the record back, and its lease
			// ends as if its process had died.
			_ = releaseScript.Run(context.WithoutCancel(ctx), s.client, []string{key},
				owner, strconv.FormatInt(res.Lease.Fence, 10)).Err()
		}
		return idem.AcquireResult{}, s.fail(ctx, "acquire", short)
	}
	return res, nil
}

func decodeAcquire(v []any, req idem.AcquireRequest, owner string) (idem.AcquireResult, error) {
	if len(v) < 2 {
		return idem.AcquireResult{}, fmt.Errorf("unexpected reply %v", v)
	}
	code, _ := v[0].(int64)
	switch code {
	case 1:
		if len(v) != 7 {
			return idem.AcquireResult{}, fmt.Errorf("unexpected reply %v", v)
		}
		var n [6]int64
		for i := range n {
			x, ok := v[i+1].(int64)
			if !ok {
				return idem.AcquireResult{}, fmt.Errorf("unexpected reply %v", v)
			}
			n[i] = x
		}
		took, fence, until, created, retention, expires := n[0], n[1], n[2], n[3], n[4], n[5]
		return idem.AcquireResult{
			Outcome: idem.Acquired,
			Lease:   idem.Lease{Scope: req.Scope, Key: req.Key, Owner: owner, Fence: fence, Until: time.UnixMilli(until)},
			Record: idem.Record{
				Scope: req.Scope, Key: req.Key, Fingerprint: req.Fingerprint,
				Status: idem.StatusProcessing, Owner: owner, Fence: fence,
				LeaseUntil: time.UnixMilli(until),
				Retention:  time.Duration(retention) * time.Millisecond,
				CreatedAt:  time.UnixMilli(created),
				ExpiresAt:  time.UnixMilli(expires),
			},
			TookOver: took == 1,
		}, nil
	case 2, 3, 4:
		fields, _ := v[1].([]any)
		rec, found, err := decodeRecord(req.Scope, req.Key, fields)
		if err != nil {
			return idem.AcquireResult{}, err
		}
		if !found {
			return idem.AcquireResult{}, errors.New("record vanished inside the script")
		}
		outcome := idem.InFlight
		switch code {
		case 3:
			outcome = idem.Completed
		case 4:
			outcome = idem.Mismatch
		}
		return idem.AcquireResult{Outcome: outcome, Record: rec}, nil
	}
	return idem.AcquireResult{}, fmt.Errorf("unexpected reply %v", v)
}

// Complete stores resp and marks the record completed, kept for
// retention; see idem.Store. Called again with the lease that completed
// the record (a retry after an error whose first call committed), it
// returns nil and leaves the record, first response and TTL included, as
// it is; complete.lua decides this in the same round trip.
func (s *Store) Complete(ctx context.Context, l idem.Lease, resp idem.Response, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if retention <= 0 {
		return fmt.Errorf("redisstore: complete: retention must be positive, got %v", retention)
	}
	if err := validateID(l.Scope, l.Key); err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	omitted := 0
	if resp.BodyOmitted {
		omitted = 1
	}
	cmd, short := s.run(ctx, completeScript, s.recordKey(l.Scope, l.Key),
		l.Owner, strconv.FormatInt(l.Fence, 10), millis(retention), s.graceMS,
		resp.StatusCode, encodeHeader(resp.Header), resp.Body, omitted)
	v, err := cmd.Int64()
	if err != nil {
		return s.fail(ctx, "complete", err)
	}
	if err := leaseLost("complete", v, l); err != nil {
		return err
	}
	if short != nil {
		// The record is completed on the primary; a retried Complete with
		// this lease answers nil there and waits again.
		return s.fail(ctx, "complete", short)
	}
	return nil
}

// Extend moves the lease's end to the server's now + ttl; see idem.Store.
func (s *Store) Extend(ctx context.Context, l idem.Lease, ttl time.Duration) (idem.Lease, error) {
	if err := ctx.Err(); err != nil {
		return idem.Lease{}, err
	}
	if ttl <= 0 {
		return idem.Lease{}, fmt.Errorf("redisstore: extend: ttl must be positive, got %v", ttl)
	}
	if err := validateID(l.Scope, l.Key); err != nil {
		return idem.Lease{}, fmt.Errorf("redisstore: extend: %w", err)
	}
	cmd, short := s.run(ctx, extendScript, s.recordKey(l.Scope, l.Key),
		l.Owner, strconv.FormatInt(l.Fence, 10), millis(ttl))
	v, err := cmd.Slice()
	if err != nil {
		return idem.Lease{}, s.fail(ctx, "extend", err)
	}
	code, _ := v[0].(int64)
	if code != 0 {
		return idem.Lease{}, leaseLost("extend", code, l)
	}
	if short != nil {
		return idem.Lease{}, s.fail(ctx, "extend", short)
	}
	until, ok := v[1].(int64)
	if len(v) != 2 || !ok {
		return idem.Lease{}, fmt.Errorf("redisstore: extend: unexpected reply %v", v)
	}
	l.Until = time.UnixMilli(until)
	return l, nil
}

// Release deletes the processing record held by l; see idem.Store.
func (s *Store) Release(ctx context.Context, l idem.Lease) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validateID(l.Scope, l.Key); err != nil {
		return fmt.Errorf("redisstore: release: %w", err)
	}
	v, err := releaseScript.Run(ctx, s.client, []string{s.recordKey(l.Scope, l.Key)},
		l.Owner, strconv.FormatInt(l.Fence, 10)).Int64()
	if err != nil {
		return s.fail(ctx, "release", err)
	}
	return leaseLost("release", v, l)
}

// Get returns the record, expired or not, with one HMGET; idem.ErrNotFound
// if none. A record stays visible for Config.Grace past its ExpiresAt,
// until Sweep or Acquire removes it.
func (s *Store) Get(ctx context.Context, scope, key string) (idem.Record, error) {
	if err := ctx.Err(); err != nil {
		return idem.Record{}, err
	}
	if err := validateID(scope, key); err != nil {
		return idem.Record{}, fmt.Errorf("redisstore: get: %w", err)
	}
	v, err := s.client.HMGet(ctx, s.recordKey(scope, key), recordFields...).Result()
	if err != nil {
		return idem.Record{}, s.fail(ctx, "get", err)
	}
	rec, found, err := decodeRecord(scope, key, v)
	if err != nil {
		return idem.Record{}, fmt.Errorf("redisstore: get: %w", err)
	}
	if !found {
		return idem.Record{}, idem.ErrNotFound
	}
	return rec, nil
}

// Delete removes the record whatever its state, with one DEL;
// idem.ErrNotFound if none.
func (s *Store) Delete(ctx context.Context, scope, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validateID(scope, key); err != nil {
		return fmt.Errorf("redisstore: delete: %w", err)
	}
	n, err := s.client.Del(ctx, s.recordKey(scope, key)).Result()
	if err != nil {
		return s.fail(ctx, "delete", err)
	}
	if n == 0 {
		return idem.ErrNotFound
	}
	return nil
}

// DeleteIf removes the record whatever its state if it still has owner
// and fence, with one Lua script; idem.ErrNotFound if there is none, and
// an error matching idem.ErrRecordChanged if it has another owner or
// fence. See idem.ConditionalDeleter.
func (s *Store) DeleteIf(ctx context.Context, scope, key, owner string, fence int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validateID(scope, key); err != nil {
		return fmt.Errorf("redisstore: delete if: %w", err)
	}
	v, err := deleteIfScript.Run(ctx, s.client, []string{s.recordKey(scope, key)},
		owner, strconv.FormatInt(fence, 10)).Result()
	if err != nil {
		return s.fail(ctx, "delete if", err)
	}
	switch v := v.(type) {
	case int64:
		switch v {
		case 0:
			return nil
		case 1:
			return idem.ErrNotFound
		}
	case []any:
		if len(v) == 1 {
			now, _ := v[0].(string)
			return fmt.Errorf("redisstore: delete if: %w: the record read at fence %d is now fence %s of another owner", idem.ErrRecordChanged, fence, now)
		}
	}
	return fmt.Errorf("redisstore: delete if: unexpected reply %v", v)
}

// fail normalises an error of the client: the context's error if it ended,
// else the error wrapped with the operation's name. redis.Nil never
// escapes.
func (s *Store) fail(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	if errors.Is(err, redis.Nil) {
		err = errors.New("unexpected nil reply")
	}
	return fmt.Errorf("redisstore: %s: %w", op, err)
}

// leaseLost turns a script's verdict into nil or an error wrapping
// idem.ErrLeaseLost.
func leaseLost(op string, code int64, l idem.Lease) error {
	switch code {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("redisstore: %s: %w: no record", op, idem.ErrLeaseLost)
	case 2:
		return fmt.Errorf("redisstore: %s: %w: record is completed", op, idem.ErrLeaseLost)
	case 3:
		return fmt.Errorf("redisstore: %s: %w: fence %d is not the record's owner and fence", op, idem.ErrLeaseLost, l.Fence)
	}
	return fmt.Errorf("redisstore: %s: unexpected reply %d", op, code)
}

func validateID(scope, key string) error {
	return errors.Join(idem.ValidateScope(scope), idem.ValidateKey(key))
}

// millis is d in whole milliseconds, rounded up so that no lease or
// retention is shorter than asked.
func millis(d time.Duration) int64 {
	ms := d / time.Millisecond
	if d%time.Millisecond > 0 {
		ms++
	}
	return int64(ms)
}

// escapeGlob escapes the characters SCAN's MATCH treats specially.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
