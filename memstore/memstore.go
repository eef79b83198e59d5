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

// entry is a stored record. Its Record.Response is always nil: a
// completed record's response is resp, encoded (see encodeResponse).
type entry struct {
	idem.Record
	resp []byte
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
	switch {
	case !ok:
		rec = &entry{Record: idem.Record{Scope: req.Scope, Key: req.Key, Fence: 1}}
	case !now.Before(rec.ExpiresAt):
		// Past its retention (completed, or processing and abandoned): a
		// new record replaces it, whatever its fingerprint; the fence keeps
		// counting.
		tookOver = rec.Status == idem.StatusProcessing
		rec = &entry{Record: idem.Record{Scope: req.Scope, Key: req.Key, Fence: rec.Fence + 1}}
	case rec.Fingerprint != req.Fingerprint:
		return rec.result(idem.Mismatch)
	case rec.Status == idem.StatusCompleted:
		return rec.result(idem.Completed)
	case now.Before(rec.LeaseUntil):
		return rec.result(idem.InFlight)
	default:
		// A processing record whose lease has ended: take it over. The
		// record keeps its CreatedAt; a new execution holds it.
		taken := *rec
		taken.Fence++
		taken.Owner = idem.NewOwner()
		taken.LeaseUntil = now.Add(req.Lease)
		taken.Retention = req.Retention
		taken.ExpiresAt = taken.LeaseUntil.Add(req.Retention)
		s.records[id] = &taken
		return idem.AcquireResult{Outcome: idem.Acquired, Lease: leaseOf(&taken.Record), Record: taken.Record, TookOver: true}, nil
	}
	rec.Fingerprint = req.Fingerprint
	rec.Status = idem.StatusProcessing
	rec.Owner = idem.NewOwner()
	rec.CreatedAt = now
	rec.LeaseUntil = now.Add(req.Lease)
	rec.Retention = req.Retention
	rec.ExpiresAt = rec.LeaseUntil.Add(req.Retention)
	s.records[id] = rec
	return idem.AcquireResult{Outcome: idem.Acquired, Lease: leaseOf(&rec.Record), Record: rec.Record, TookOver: tookOver}, nil
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
	stored := encodeResponse(&resp)

	s.mu.Lock()
	defer s.mu.Unlock()
	rec, err := s.held(l)
	if err != nil {
		if completedBy(s.records[recordID{l.Scope, l.Key}], l) {
			return nil // an earlier call with l completed it: keep its response
		}
		return fmt.Errorf("memstore: complete: %w", err)
	}
	now := s.now()
	rec.Status = idem.StatusCompleted
	rec.resp = stored
	rec.CompletedAt = now
	rec.Retention = retention
	rec.ExpiresAt = now.Add(retention)
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
	rec.LeaseUntil = s.now().Add(ttl)
	rec.ExpiresAt = rec.LeaseUntil.Add(rec.Retention)
	return leaseOf(&rec.Record), nil
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
	rec, ok := s.records[recordID{scope, key}]
	if !ok {
		return idem.Record{}, idem.ErrNotFound
	}
	return rec.record()
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
	case rec.Owner != owner || rec.Fence != fence:
		return fmt.Errorf("memstore: delete if: %w: the record read at fence %d is now fence %d of another owner", idem.ErrRecordChanged, fence, rec.Fence)
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
		if now.Before(rec.ExpiresAt) {
			continue
		}
		if rec.Status == idem.StatusProcessing && now.Before(rec.LeaseUntil) {
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
	case rec.Status != idem.StatusProcessing:
		return nil, fmt.Errorf("%w: record is %s", idem.ErrLeaseLost, rec.Status)
	case rec.Owner != l.Owner || rec.Fence != l.Fence:
		return nil, fmt.Errorf("%w: fence %d is now held by fence %d", idem.ErrLeaseLost, l.Fence, rec.Fence)
	}
	return rec, nil
}

// completedBy reports whether rec is completed and was completed with l's
// owner and fence. The caller holds s.mu.
func completedBy(rec *entry, l idem.Lease) bool {
	return rec != nil && rec.Status == idem.StatusCompleted && rec.Owner == l.Owner && rec.Fence == l.Fence
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

// record returns a copy of the record, its response decoded (sharing no
// memory with the store).
func (e *entry) record() (idem.Record, error) {
	c := e.Record
	if e.resp != nil {
		r, err := decodeResponse(e.resp)
		if err != nil {
			return idem.Record{}, err
		}
		c.Response = r
	}
	return c, nil
}

// result is an Acquire's answer of outcome with a copy of the record.
func (e *entry) result(outcome idem.Outcome) (idem.AcquireResult, error) {
	rec, err := e.record()
	if err != nil {
		return idem.AcquireResult{}, err
	}
	return idem.AcquireResult{Outcome: outcome, Record: rec}, nil
}
