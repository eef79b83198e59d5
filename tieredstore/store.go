package tieredstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/rediskey"
)

// Defaults of Config.
const (
	// DefaultPrefix starts the name of every cache entry.
	DefaultPrefix = "idem-cache"
	// DefaultTimeout bounds each Redis call.
	DefaultTimeout = 50 * time.Millisecond
	// DefaultCooldown is how long Redis is skipped after it failed.
	DefaultCooldown = time.Second
	// DefaultMarkerTTL is Config.MarkerTTL's default.
	DefaultMarkerTTL = time.Second
)

// Config configures a Store. A nil Config, and the zero value of each
// field, mean the default.
type Config struct {
	// Prefix starts the name of every cache entry ("PREFIX:{…}"). It may
	// not contain '{', '}', spaces or control characters, and is at most 64
	// bytes. Use a prefix of its own, not a redisstore's. Default
	// "idem-cache".
	Prefix string
	// Timeout bounds each Redis call: past it the call counts as failed
	// and the operation goes on with the truth alone. Default 50 ms.
	Timeout time.Duration
	// Cooldown is how long Redis is skipped after a failed call; then one
	// call probes it again. Default 1 s.
	Cooldown time.Duration
	// MarkerTTL caps how long an in-flight entry lives in Redis (never
	// longer than the lease). It bounds how long a marker whose deletion
	// failed (Redis slow or down when the execution ended) keeps answering
	// 409 to retries; duplicates that arrive after it go to the truth.
	// Default 1 s.
	MarkerTTL time.Duration
	// Logger receives a warning when Redis fails and the circuit opens, and
	// a message when Redis answers again (at most one of each per
	// cooldown). Nil discards them.
	Logger *slog.Logger
}

// Client is what a Store needs of a go-redis client. *redis.Client,
// *redis.ClusterClient, *redis.Ring and every redis.UniversalClient
// implement it. Set the client's ContextTimeoutEnabled: the Store then
// makes each call on the caller's goroutine with a deadline of
// Config.Timeout, which the client honours on the socket. Without it (or
// with a client whose options the Store cannot read) the Store runs each
// call on a goroutine of its own and stops waiting for it at
// Config.Timeout; that hand-off costs a goroutine wake-up per call (about
// 25 µs on the project's 2-core machine, where a PING takes 50 µs).
type Client interface {
	Get(ctx context.Context, key string) *redis.StringCmd
	Set(ctx context.Context, key string, value any, expiration time.Duration) *redis.StatusCmd
	Del(ctx context.Context, keys ...string) *redis.IntCmd
}

// Store is an idem.Store with Redis in front of a truth store, as New
// returns it. It is safe for concurrent use.
//
// A Store implements idem.TxCompleter exactly when its truth does, as New
// found it: over a truth with CompleteTx (sqlstore), the value New returns
// has CompleteTx too, which completes through the truth's and deletes the
// key's in-flight entry; over one without (memstore, redisstore), it has
// none, so a Guard answers idem.ErrTxUnsupported before it calls the store.
// Type-assert the Store (or the idem.Store it is stored in) to
// idem.TxCompleter to tell. Likewise it implements idem.ConditionalDeleter
// exactly when its truth does (memstore, redisstore and sqlstore all do):
// DeleteIf deletes in the truth, then the cache entry, as Delete.
//
// A Store holds no goroutine, timer or connection between calls, so it has
// no Close: close the Redis client and the truth store when done with them.
type Store interface {
	idem.Store
	// Truth returns the store that decides every acquisition and
	// completion.
	Truth() idem.Store
	// Stats returns the store's counters.
	Stats() Stats
}

// store is a Store over a truth without idem.TxCompleter.
type store struct {
	front    Client
	truth    idem.Store
	prefix   string
	timeout  time.Duration
	inline   bool // front honours context deadlines: calls run on the caller's goroutine
	marker   time.Duration
	log      *slog.Logger
	circuit  *circuit
	counters counters
}

// txStore is a Store over a truth with idem.TxCompleter.
type txStore struct {
	*store
	txc idem.TxCompleter
}

// deleterStore is a Store over a truth with idem.ConditionalDeleter.
type deleterStore struct {
	*store
	cd idem.ConditionalDeleter
}

// txDeleterStore is a Store over a truth with idem.TxCompleter and
// idem.ConditionalDeleter.
type txDeleterStore struct {
	*txStore
	cd idem.ConditionalDeleter
}

var (
	_ Store                   = (*store)(nil)
	_ Store                   = (*txStore)(nil)
	_ idem.TxCompleter        = (*txStore)(nil)
	_ Store                   = (*deleterStore)(nil)
	_ idem.ConditionalDeleter = (*deleterStore)(nil)
	_ Store                   = (*txDeleterStore)(nil)
	_ idem.TxCompleter        = (*txDeleterStore)(nil)
	_ idem.ConditionalDeleter = (*txDeleterStore)(nil)
	_ Client                  = redis.UniversalClient(nil)
)

// New returns a Store that answers from front what is safe to answer
// without truth, and asks truth everything else. The Store implements
// idem.TxCompleter if and only if truth does, and idem.ConditionalDeleter
// if and only if truth does. A nil cfg means defaults;
// cfg is copied. New does not contact either store.
func New(front Client, truth idem.Store, cfg *Config) (Store, error) {
	if front == nil {
		return nil, errors.New("tieredstore: New needs a Redis client")
	}
	if truth == nil {
		return nil, errors.New("tieredstore: New needs a truth store")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if err := rediskey.ValidatePrefix("tieredstore", c.Prefix); err != nil {
		return nil, err
	}
	if c.Timeout < 0 || c.Cooldown < 0 || c.MarkerTTL < 0 {
		return nil, fmt.Errorf("tieredstore: negative duration in Config (timeout %v, cooldown %v, marker TTL %v)", c.Timeout, c.Cooldown, c.MarkerTTL)
	}
	if c.MarkerTTL == 0 {
		c.MarkerTTL = DefaultMarkerTTL
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Cooldown == 0 {
		c.Cooldown = DefaultCooldown
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	s := &store{
		front:   front,
		truth:   truth,
		prefix:  c.Prefix,
		timeout: c.Timeout,
		inline:  honoursDeadlines(front),
		marker:  c.MarkerTTL,
		log:     c.Logger,
		circuit: newCircuit(c.Cooldown),
	}
	txc, isTx := truth.(idem.TxCompleter)
	cd, isCD := truth.(idem.ConditionalDeleter)
	switch {
	case isTx && isCD:
		return &txDeleterStore{txStore: &txStore{store: s, txc: txc}, cd: cd}, nil
	case isTx:
		return &txStore{store: s, txc: txc}, nil
	case isCD:
		return &deleterStore{store: s, cd: cd}, nil
	}
	return s, nil
}

// Truth returns the store that decides every acquisition and completion.
func (s *store) Truth() idem.Store { return s.truth }

// Stats returns the store's counters.
func (s *store) Stats() Stats { return s.counters.snapshot() }

// Acquire claims the lease on (req.Scope, req.Key); see idem.Store. A
// completed or in-flight key whose entry is in Redis is answered from it;
// everything else is decided by the truth, and the cache is filled from
// its answer.
func (s *store) Acquire(ctx context.Context, req idem.AcquireRequest) (idem.AcquireResult, error) {
	if err := req.Validate(); err != nil {
		return idem.AcquireResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return idem.AcquireResult{}, err
	}
	name := s.entryKey(req.Scope, req.Key)
	if rec, ok := s.lookup(ctx, name, req.Scope, req.Key); ok {
		if res, ok := answer(rec, req.Fingerprint, time.Now()); ok {
			s.counters.hits.Add(1)
			return res, nil
		}
	}
	s.counters.misses.Add(1)
	sent := time.Now()
	res, err := s.truth.Acquire(ctx, req)
	if err != nil {
		return res, err
	}
	switch {
	case res.Outcome == idem.Acquired:
		d := min(req.Lease, s.marker)
		if rec := res.Record; rec.Status == idem.StatusProcessing && rec.Owner == res.Lease.Owner && rec.Fence == res.Lease.Fence {
			s.put(ctx, name, rec, d-time.Since(sent)) // the record as the truth wrote it
		} else {
			s.refill(ctx, name, res.Lease, idem.StatusProcessing, d, sent)
		}
	case res.Record.Status == idem.StatusCompleted: // Completed, or Mismatch on a completed record
		s.fillCompleted(ctx, name, res.Record)
	}
	// An InFlight or Mismatch answer on a processing record is someone
	// else's lease: it is not cached (its holder writes the entry).
	return res, nil
}

// answer decides an Acquire from a cached record, if the record may still
// be used at now (the application's clock; the entry's TTL already bounds
// it on Redis' clock).
func answer(rec idem.Record, fp idem.Fingerprint, now time.Time) (idem.AcquireResult, bool) {
	switch rec.Status {
	case idem.StatusCompleted:
		if !now.Before(rec.ExpiresAt) {
			return idem.AcquireResult{}, false
		}
		if rec.Fingerprint == fp {
			return idem.AcquireResult{Outcome: idem.Completed, Record: rec}, true
		}
	case idem.StatusProcessing:
		if !now.Before(rec.LeaseUntil) {
			return idem.AcquireResult{}, false
		}
		if rec.Fingerprint == fp {
			return idem.AcquireResult{Outcome: idem.InFlight, Record: rec}, true
		}
	default:
		return idem.AcquireResult{}, false
	}
	return idem.AcquireResult{Outcome: idem.Mismatch, Record: rec}, true
}

// RecordCompleter is a truth store that can return the record it
// completes, as Get would return it, at less cost than Complete and Get
// ([github.com/idemkit/idem/sqlstore.Store] is one). The tiered store
// then caches that record instead of reading it back.
type RecordCompleter interface {
	CompleteRecord(ctx context.Context, l idem.Lease, resp idem.Response, retention time.Duration) (idem.Record, error)
}

// Complete stores resp in the truth, then replaces the key's in-flight
// entry by the completed record; see idem.Store.
//
// When the truth answers an error the entry is deleted: the truth may
// have completed the record before its reply was lost, and an in-flight
// entry left behind would answer InFlight instead of the stored response
// until its TTL. (An entry that was another lease's, when the error is
// idem.ErrLeaseLost, only sends that lease's duplicates to the truth.)
func (s *store) Complete(ctx context.Context, l idem.Lease, resp idem.Response, retention time.Duration) error {
	sent := time.Now()
	name := s.entryKey(l.Scope, l.Key)
	if rc, ok := s.truth.(RecordCompleter); ok {
		rec, err := rc.CompleteRecord(ctx, l, resp, retention)
		if err != nil {
			_ = s.del(ctx, name)
			return err
		}
		if rec.Status == idem.StatusCompleted && rec.Owner == l.Owner && rec.Fence == l.Fence {
			// A retry of a completion that committed before (its reply was
			// lost) returns the record as then stored: its ExpiresAt counts
			// from the first completion, with that call's retention, so the
			// entry must end by it too (the application's clock, as for a
			// record found in the truth).
			s.put(ctx, name, rec, min(retention-time.Since(sent), time.Until(rec.ExpiresAt)))
		} else {
			_ = s.del(ctx, name)
		}
		return nil
	}
	if err := s.truth.Complete(ctx, l, resp, retention); err != nil {
		_ = s.del(ctx, name)
		return err
	}
	s.refill(ctx, name, l, idem.StatusCompleted, retention, sent)
	return nil
}

// CompleteTx completes the record in tx through the truth's
// idem.TxCompleter, and deletes the key's in-flight entry: until tx
// commits, duplicates are answered by the truth, and the first Get or
// Acquire after the commit caches the completed record.
//
// When the truth answers idem.ErrFinished (a retry of a CompleteTx whose
// commit's reply was lost: the record is completed already) the in-flight
// entry is deleted too, or it would answer InFlight instead of the stored
// response until its TTL.
func (s *txStore) CompleteTx(ctx context.Context, tx *sql.Tx, l idem.Lease, resp idem.Response, retention time.Duration) error {
	err := s.txc.CompleteTx(ctx, tx, l, resp, retention)
	if err == nil || errors.Is(err, idem.ErrFinished) {
		_ = s.del(ctx, s.entryKey(l.Scope, l.Key))
	}
	return err
}

// Release deletes the record in the truth, then its in-flight entry; see
// idem.Store.
//
// The entry is deleted whatever the truth answered: a Release whose reply
// was lost deleted the record all the same, and when it is sent again the
// truth answers idem.ErrLeaseLost. An entry left behind would answer
// InFlight until its TTL to retries the truth would let run. Deleting an
// entry is always safe: duplicates then go to the truth.
func (s *store) Release(ctx context.Context, l idem.Lease) error {
	err := s.truth.Release(ctx, l)
	_ = s.del(ctx, s.entryKey(l.Scope, l.Key))
	return err
}

// Extend deletes the in-flight entry, moves the lease's end in the truth,
// then writes the entry again with the new end; see idem.Store.
//
// The entry goes first because Extend may move the end earlier: an entry
// with the old end, read while the truth has the new one, would answer
// InFlight after the truth's lease had ended (found by the lincheck
// model). Without the entry, duplicates meanwhile are decided by the
// truth. If Redis cannot delete it (or the delete is skipped while the
// circuit is open, and the circuit closes before the entry's TTL ends),
// the entry may answer so until its TTL (which the old lease and
// MarkerTTL bound), as after any cache write Redis missed.
//
// A caller that ends the lease (Complete, CompleteTx, Release) while its
// Extend is still running cancels the Extend's context first: the Guard
// halts its watchdog's renewal so, and does not wait for it. The entry is
// deleted again when ctx has ended by the time it is written: the
// read-back may have found the processing record just before the
// completion, and the entry written from it may land after the
// completion's, where it would answer InFlight (409) for up to MarkerTTL
// while the truth holds the response, or no record after a Release. A
// caller that ends the lease with the Extend still running, its context
// live, leaves that window open (see the package doc).
func (s *store) Extend(ctx context.Context, l idem.Lease, ttl time.Duration) (idem.Lease, error) {
	name := s.entryKey(l.Scope, l.Key)
	_ = s.del(ctx, name)
	sent := time.Now()
	nl, err := s.truth.Extend(ctx, l, ttl)
	if err != nil {
		return nl, err
	}
	s.refill(ctx, name, l, idem.StatusProcessing, min(ttl, s.marker), sent)
	if ctx.Err() != nil {
		// Cancelled before the entry was written, or while it was: the
		// lease may have ended meanwhile (see above).
		_ = s.del(ctx, name)
	}
	return nl, nil
}

// Get returns the truth's record; a live completed record is cached.
func (s *store) Get(ctx context.Context, scope, key string) (idem.Record, error) {
	rec, err := s.truth.Get(ctx, scope, key)
	if err == nil && rec.Status == idem.StatusCompleted {
		s.fillCompleted(ctx, s.entryKey(scope, key), rec)
	}
	return rec, err
}

// ErrCacheEntryKept is returned (wrapped, with Redis' error) by Delete and
// DeleteIf when the truth deleted the record, or had none, but the
// record's Redis entry could not be deleted (Redis unreachable, slow, or
// skipped while the circuit is open): a completed entry may go on
// answering replays of the evicted record until its TTL. Delete again once
// Redis answers; the truth then answers idem.ErrNotFound, and the entry is
// deleted all the same.
var ErrCacheEntryKept = errors.New("tieredstore: the record is deleted from the truth, but its Redis entry could not be deleted and may answer replays until its TTL; delete again once Redis answers")

// Delete removes the record from the truth, then its cache entry, when the
// truth deleted it or had none (an entry may outlive a record deleted
// while Redis was unreachable). A cache entry that could not be deleted
// gives ErrCacheEntryKept.
func (s *store) Delete(ctx context.Context, scope, key string) error {
	err := s.truth.Delete(ctx, scope, key)
	if err == nil || errors.Is(err, idem.ErrNotFound) {
		if derr := s.evictEntry(ctx, s.entryKey(scope, key)); derr != nil {
			return errors.Join(fmt.Errorf("%w: %w", ErrCacheEntryKept, derr), err)
		}
	}
	return err
}

// DeleteIf deletes the record in the truth if it still has owner and
// fence (see idem.ConditionalDeleter), then its cache entry as Delete does:
// when the truth deleted it or had no record. A record the truth kept
// (idem.ErrRecordChanged) keeps its entry, which is the new execution's.
func (s *deleterStore) DeleteIf(ctx context.Context, scope, key, owner string, fence int64) error {
	return s.deleteIf(ctx, s.cd, scope, key, owner, fence)
}

// DeleteIf is deleterStore's.
func (s *txDeleterStore) DeleteIf(ctx context.Context, scope, key, owner string, fence int64) error {
	return s.deleteIf(ctx, s.cd, scope, key, owner, fence)
}

func (s *store) deleteIf(ctx context.Context, cd idem.ConditionalDeleter, scope, key, owner string, fence int64) error {
	err := cd.DeleteIf(ctx, scope, key, owner, fence)
	if err == nil || errors.Is(err, idem.ErrNotFound) {
		if derr := s.evictEntry(ctx, s.entryKey(scope, key)); derr != nil {
			return errors.Join(fmt.Errorf("%w: %w", ErrCacheEntryKept, derr), err)
		}
	}
	return err
}

// Sweep sweeps the truth. Cache entries expire by their TTL.
func (s *store) Sweep(ctx context.Context, limit int) (int, error) {
	return s.truth.Sweep(ctx, limit)
}

// refill reads back the record that l just extended (or acquired or
// completed in a truth that did not return it) and caches it, for d (the
// lease, ttl or retention the truth was given) from sent (when the truth
// call was sent; the truth counted d from no earlier). If the record is no
// longer l's in the expected state, or cannot be read, the entry is
// deleted.
func (s *store) refill(ctx context.Context, name string, l idem.Lease, want idem.Status, d time.Duration, sent time.Time) {
	if s.circuit.skipping() {
		s.counters.skipped.Add(1) // spare the truth a read nobody would cache
		return
	}
	rec, err := s.truth.Get(ctx, l.Scope, l.Key)
	if err != nil || rec.Status != want || rec.Owner != l.Owner || rec.Fence != l.Fence {
		_ = s.del(ctx, name)
		return
	}
	ttl := d - time.Since(sent)
	if want == idem.StatusCompleted {
		// A retried Complete finds the record as the first completion
		// stored it (see Complete).
		ttl = min(ttl, time.Until(rec.ExpiresAt))
	}
	s.put(ctx, name, rec, ttl)
}

// fillCompleted caches a completed record the truth returned, until its
// ExpiresAt by the application's clock, and never for longer than its
// retention.
func (s *store) fillCompleted(ctx context.Context, name string, rec idem.Record) {
	ttl := min(time.Until(rec.ExpiresAt), rec.ExpiresAt.Sub(rec.CompletedAt))
	if ttl >= time.Millisecond {
		s.put(ctx, name, rec, ttl)
	}
}

// put writes rec as the entry name for ttl, rounded down to whole
// milliseconds; a ttl under a millisecond deletes the entry instead.
func (s *store) put(ctx context.Context, name string, rec idem.Record, ttl time.Duration) {
	ttl = ttl.Truncate(time.Millisecond)
	if ttl <= 0 {
		_ = s.del(ctx, name)
		return
	}
	v := encodeEntry(rec)
	_, _ = s.call(ctx, "set", func(ctx context.Context) ([]byte, error) {
		return nil, s.front.Set(ctx, name, v, ttl).Err()
	})
}

func (s *store) del(ctx context.Context, name string) error {
	_, err := s.call(ctx, "del", func(ctx context.Context) ([]byte, error) {
		return nil, s.front.Del(ctx, name).Err()
	})
	return err
}

// evictEntry deletes the entry name for an eviction (Delete, DeleteIf):
// tried even while the circuit is open, since an entry left behind goes on
// answering replays of a record the operator removed.
func (s *store) evictEntry(ctx context.Context, name string) error {
	_, err := s.run(ctx, "del", func(ctx context.Context) ([]byte, error) {
		return nil, s.front.Del(ctx, name).Err()
	})
	return err
}

// lookup reads the entry name; ok is false on a miss, a Redis failure or
// a malformed entry.
func (s *store) lookup(ctx context.Context, name, scope, key string) (idem.Record, bool) {
	b, err := s.call(ctx, "get", func(ctx context.Context) ([]byte, error) {
		return s.front.Get(ctx, name).Bytes()
	})
	if err != nil {
		return idem.Record{}, false
	}
	rec, err := decodeEntry(scope, key, b)
	if err != nil {
		s.log.WarnContext(ctx, "tieredstore: ignoring a cache entry", idem.LogKey(scope, key, false), slog.Any(idem.LogErr, err))
		return idem.Record{}, false
	}
	return rec, true
}

var errSkipped = errors.New("tieredstore: redis skipped while the circuit is open")

type callResult struct {
	b   []byte
	err error
}

// call runs fn against Redis, bounded by the timeout whatever the client
// does with its context, unless the circuit is open. A miss (redis.Nil) is
// an answer; any other error, or no answer within the timeout, opens the
// circuit. The caller's cancellation does not cut the call short: a
// cache write that follows a truth write is worth finishing.
func (s *store) call(ctx context.Context, op string, fn func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	if !s.circuit.allow() {
		s.counters.skipped.Add(1)
		return nil, errSkipped
	}
	return s.run(ctx, op, fn)
}

// run makes a call to Redis whatever the circuit's state (call, without
// the circuit's check).
func (s *store) run(ctx context.Context, op string, fn func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	var r callResult
	if s.inline {
		// The client ends the call at cctx's deadline by itself.
		r.b, r.err = fn(cctx)
		if r.err != nil && cctx.Err() != nil {
			r.err = fmt.Errorf("no answer within %v: %w", s.timeout, r.err)
		}
		return s.settle(ctx, op, r)
	}
	done := make(chan callResult, 1)
	go func() {
		b, err := fn(cctx)
		done <- callResult{b, err}
	}()
	select {
	case r = <-done:
	case <-cctx.Done():
		r.err = fmt.Errorf("no answer within %v: %w", s.timeout, cctx.Err())
	}
	return s.settle(ctx, op, r)
}

// settle counts the outcome of a call and moves the circuit.
func (s *store) settle(ctx context.Context, op string, r callResult) ([]byte, error) {
	if r.err == nil || errors.Is(r.err, redis.Nil) {
		if s.circuit.succeed() {
			s.log.InfoContext(ctx, "tieredstore: redis answers again", "op", op)
		}
		return r.b, r.err
	}
	s.counters.errors.Add(1)
	if s.circuit.fail() {
		s.counters.trips.Add(1)
		s.log.WarnContext(ctx, "tieredstore: redis failed; using the truth store alone", "op", op, "cooldown", s.circuit.cooldown, "error", r.err)
	} else {
		s.log.DebugContext(ctx, "tieredstore: redis still failing", "op", op, "error", r.err)
	}
	return nil, r.err
}

// honoursDeadlines reports whether c is a go-redis client whose options
// say it honours context deadlines (ContextTimeoutEnabled), so that a call
// given a deadline ends by it.
func honoursDeadlines(c Client) bool {
	switch c := c.(type) {
	case interface{ Options() *redis.Options }:
		return c.Options().ContextTimeoutEnabled
	case interface{ Options() *redis.ClusterOptions }:
		return c.Options().ContextTimeoutEnabled
	case interface{ Options() *redis.RingOptions }:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}
