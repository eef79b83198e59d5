package memstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem"
)

// Config configures a Store. A nil Config, and the zero value of each
// field, mean the default.
type Config struct {
	// Now is the store's clock: every lease and expiry is decided by it.
	// Nil means time.Now. Tests may pass a fake clock; it must be safe for
	// concurrent use.
	Now func() time.Time
}

// Store is an in-process idem.Store. The zero value is not usable; call
// New. A Store is safe for concurrent use.
type Store struct {
	now func() time.Time

	mu      sync.Mutex
	records map[recordID]*entry
}

// entry is a stored record, kept so that the garbage collector scans a
// few words of it however large its response: its pointers are text, a
// string holding its fingerprint, its owner and, once completed, its
// encoded response (see encodeResponse), and the locations of its two
// deciding times (for time.Now's, the same static variable). A record
// handed out shares text's memory (strings do not change) but for its
// body, which it copies.
type entry struct {
	text                   string
	fpLen, ownerLen        int
	completed              bool
	fence                  int64
	retention              time.Duration
	createdAt, completedAt instant
	// leaseUntil and expiresAt decide leases and expiry: they are the
	// clock's times as they came, monotonic reading included, so that
	// they compare with its now as time.Time does, on the monotonic clock
	// when both have one (time.Now's do). A lease is a duration: a step
	// of the system's wall clock (NTP, a resumed VM) must neither end it
	// early, letting a retry run the effect while its first execution
	// still runs, nor stretch it; nor expire a completed record early.
	leaseUntil, expiresAt time.Time
}

// instant is a time without its location or monotonic reading, which a
// time that decides nothing does not need: seconds and nanoseconds since
// the Unix epoch.
type instant struct {
	sec  int64
	nsec int32
}

func at(t time.Time) instant      { return instant{t.Unix(), int32(t.Nanosecond())} }
func (i instant) time() time.Time { return time.Unix(i.sec, int64(i.nsec)) }

// wall is leaseUntil or expiresAt as a record handed out gives it: as
// instant does, without location or monotonic reading.
func wall(t time.Time) time.Time { return at(t).time() }

func (e *entry) fingerprint() string { return e.text[:e.fpLen] }
func (e *entry) owner() string       { return e.text[e.fpLen : e.fpLen+e.ownerLen] }

// newEntry is a processing record of fingerprint fp held by owner.
func newEntry(fp idem.Fingerprint, owner string, fence int64) *entry {
	return &entry{text: string(fp) + owner, fpLen: len(fp), ownerLen: len(owner), fence: fence}
}

type recordID struct{ scope, key string }

var (
	_ idem.Store              = (*Store)(nil)
	_ idem.ConditionalDeleter = (*Store)(nil)
)

// New returns an empty Store. A nil cfg means defaults; cfg is copied.
func New(cfg *Config) *Store {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return &Store{now: c.Now, records: make(map[recordID]*entry)}
}

// Acquire claims the lease on (req.Scope, req.Key); see idem.Store.
func (s *Store) Acquire(ctx context.Context, req idem.AcquireRequest) (idem.AcquireResult, error) {
	if err := ctx.Err(); err != nil {
		return idem.AcquireResult{}, err
	}
	if err := req.Validate(); err != nil {
		return idem.AcquireResult{}, err
	}
	id := recordID{req.Scope, req.Key}

	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	rec, ok := s.records[id]
	tookOver := false
	var fence int64 = 1
	switch {
	case !ok:
	case !rec.expiresAt.After(now):
		// Past its retention (completed, or processing and abandoned): a
		// new record replaces it, whatever its fingerprint; the fence keeps
		// counting.
		tookOver = !rec.completed
		fence = rec.fence + 1
	case rec.fingerprint() != string(req.Fingerprint):
		return rec.result(id, idem.Mismatch)
	case rec.completed:
		return rec.result(id, idem.Completed)
	case rec.leaseUntil.After(now):
		return rec.result(id, idem.InFlight)
	default:
		// A processing record whose lease has ended: take it over. The
		// record keeps its CreatedAt; a new execution holds it.
		taken := newEntry(req.Fingerprint, idem.NewOwner(), rec.fence+1)
		taken.createdAt = rec.createdAt
		taken.leaseUntil = now.Add(req.Lease)
		taken.retention = req.Retention
		taken.expiresAt = now.Add(req.Lease).Add(req.Retention)
		s.records[id] = taken
		r, _ := taken.record(id)
		return idem.AcquireResult{Outcome: idem.Acquired, Lease: leaseOf(&r), Record: r, TookOver: true}, nil
	}
	e := newEntry(req.Fingerprint, idem.NewOwner(), fence)
	e.createdAt = at(now)
	e.leaseUntil = now.Add(req.Lease)
	e.retention = req.Retention
	e.expiresAt = now.Add(req.Lease).Add(req.Retention)
	s.records[id] = e
	r, _ := e.record(id)
	return idem.AcquireResult{Outcome: idem.Acquired, Lease: leaseOf(&r), Record: r, TookOver: tookOver}, nil
}

// Complete stores resp (a deep copy) and marks the record completed, kept
// for retention; see idem.Store. Called again with the lease that
// completed the record (a retry after an error), it returns nil and leaves
// the record, first response included, as it is.
func (s *Store) Complete(ctx context.Context, l idem.Lease, resp idem.Response, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if retention <= 0 {
		return fmt.Errorf("memstore: complete: retention must be positive, got %v", retention)
	}
	if err := validateLease(l); err != nil {
		return fmt.Errorf("memstore: complete: %w", err)
	}
	id := recordID{l.Scope, l.Key}

	s.mu.Lock()
	defer s.mu.Unlock()
	rec, err := s.held(l)
	if err != nil {
		if completedBy(s.records[id], l) {
			return nil // an earlier call with l completed it: keep its response
		}
		return fmt.Errorf("memstore: complete: %w", err)
	}
	now := s.now()
	rec.text = appendResponse(rec.text, &resp)
	rec.completed = true
	rec.completedAt = at(now)
	rec.retention = retention
	rec.expiresAt = now.Add(retention)
	return nil
}

// Release deletes the processing record held by l; see idem.Store.
func (s *Store) Release(ctx context.Context, l idem.Lease) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validateLease(l); err != nil {
		return fmt.Errorf("memstore: release: %w", err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.held(l); err != nil {
		return fmt.Errorf("memstore: release: %w", err)
	}
	delete(s.records, recordID{l.Scope, l.Key})
	return nil
}

// Extend moves the lease's end to the store's now + ttl; see idem.Store.
func (s *Store) Extend(ctx context.Context, l idem.Lease, ttl time.Duration) (idem.Lease, error) {
	if err := ctx.Err(); err != nil {
		return idem.Lease{}, err
	}
	if ttl <= 0 {
		return idem.Lease{}, fmt.Errorf("memstore: extend: ttl must be positive, got %v", ttl)
	}
	if err := validateLease(l); err != nil {
		return idem.Lease{}, fmt.Errorf("memstore: extend: %w", err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	rec, err := s.held(l)
	if err != nil {
		return idem.Lease{}, fmt.Errorf("memstore: extend: %w", err)
	}
	until := s.now().Add(ttl)
	rec.leaseUntil = until
	rec.expiresAt = until.Add(rec.retention)
	return idem.Lease{Scope: l.Scope, Key: l.Key, Owner: rec.owner(), Fence: rec.fence, Until: wall(rec.leaseUntil)}, nil
}

// Get returns a copy of the record, expired or not; idem.ErrNotFound if
// none.
func (s *Store) Get(ctx context.Context, scope, key string) (idem.Record, error) {
	if err := ctx.Err(); err != nil {
		return idem.Record{}, err
	}
	if err := validateID(scope, key); err != nil {
		return idem.Record{}, fmt.Errorf("memstore: get: %w", err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	id := recordID{scope, key}
	rec, ok := s.records[id]
	if !ok {
		return idem.Record{}, idem.ErrNotFound
	}
	return rec.record(id)
}

// Delete removes the record whatever its state; idem.ErrNotFound if none.
func (s *Store) Delete(ctx context.Context, scope, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validateID(scope, key); err != nil {
		return fmt.Errorf("memstore: delete: %w", err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	id := recordID{scope, key}
	if _, ok := s.records[id]; !ok {
		return idem.ErrNotFound
	}
	delete(s.records, id)
	return nil
}

// DeleteIf removes the record whatever its state if its owner and fence
// are still owner and fence; idem.ErrNotFound if there is none, and an
// error matching idem.ErrRecordChanged if it has another owner or fence.
// See idem.ConditionalDeleter.
func (s *Store) DeleteIf(ctx context.Context, scope, key, owner string, fence int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validateID(scope, key); err != nil {
		return fmt.Errorf("memstore: delete if: %w", err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	id := recordID{scope, key}
	rec, ok := s.records[id]
	switch {
	case !ok:
		return idem.ErrNotFound
	case rec.owner() != owner || rec.fence != fence:
		return fmt.Errorf("memstore: delete if: %w: the record read at fence %d is now fence %d of another owner", idem.ErrRecordChanged, fence, rec.fence)
	}
	delete(s.records, id)
	return nil
}

// Sweep removes up to limit records whose ExpiresAt has passed (limit <= 0
// means idem.DefaultSweepLimit) and returns how many it removed. It never
// removes a processing record whose lease is live. It holds the store's
// mutex while it scans every record.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if limit <= 0 {
		limit = idem.DefaultSweepLimit
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	n := 0
	for id, rec := range s.records {
		if n >= limit {
			break
		}
		if rec.expiresAt.After(now) {
			continue
		}
		if !rec.completed && rec.leaseUntil.After(now) {
			continue // never a live lease, whatever ExpiresAt says
		}
		delete(s.records, id)
		n++
	}
	return n, nil
}

// held returns the record l holds: processing, with l's owner and fence.
// The lease's end does not matter: a lease that ran out still holds its
// record until someone takes it over. The caller holds s.mu.
func (s *Store) held(l idem.Lease) (*entry, error) {
	rec, ok := s.records[recordID{l.Scope, l.Key}]
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: no record", idem.ErrLeaseLost)
	case rec.completed:
		return nil, fmt.Errorf("%w: record is %s", idem.ErrLeaseLost, idem.StatusCompleted)
	case rec.owner() != l.Owner || rec.fence != l.Fence:
		return nil, fmt.Errorf("%w: fence %d is now held by fence %d", idem.ErrLeaseLost, l.Fence, rec.fence)
	}
	return rec, nil
}

// completedBy reports whether rec is completed and was completed with l's
// owner and fence. The caller holds s.mu.
func completedBy(rec *entry, l idem.Lease) bool {
	return rec != nil && rec.completed && rec.owner() == l.Owner && rec.fence == l.Fence
}

func validateID(scope, key string) error {
	return errors.Join(idem.ValidateScope(scope), idem.ValidateKey(key))
}

func validateLease(l idem.Lease) error {
	return validateID(l.Scope, l.Key)
}

func leaseOf(rec *idem.Record) idem.Lease {
	return idem.Lease{Scope: rec.Scope, Key: rec.Key, Owner: rec.Owner, Fence: rec.Fence, Until: rec.LeaseUntil}
}

// record returns the record of id, its response decoded: it shares only
// strings with the store.
func (e *entry) record(id recordID) (idem.Record, error) {
	r := idem.Record{
		Scope: id.scope, Key: id.key, Fingerprint: idem.Fingerprint(e.fingerprint()), Owner: e.owner(),
		Status: idem.StatusProcessing, Fence: e.fence, Retention: e.retention,
		LeaseUntil: wall(e.leaseUntil), CreatedAt: e.createdAt.time(), ExpiresAt: wall(e.expiresAt),
	}
	if e.completed {
		resp, err := decodeResponse(e.text[e.fpLen+e.ownerLen:])
		if err != nil {
			return idem.Record{}, err
		}
		r.Status, r.Response, r.CompletedAt = idem.StatusCompleted, resp, e.completedAt.time()
	}
	return r, nil
}

// result is an Acquire's answer of outcome with the record of id.
func (e *entry) result(id recordID, outcome idem.Outcome) (idem.AcquireResult, error) {
	rec, err := e.record(id)
	if err != nil {
		return idem.AcquireResult{}, err
	}
	return idem.AcquireResult{Outcome: outcome, Record: rec}, nil
}
