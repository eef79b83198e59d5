package idem

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

// ObserveStore returns s reporting each call to o: a KindStore event per
// call (Op the method, Store name, Outcome OutcomeOK or OutcomeError,
// Duration, Err, and KeyHash of the record's scope and key), and a
// KindSweep event (Op SweepRecords, N the records removed) after each Sweep
// that succeeds. A nil o returns s itself.
//
// Outcome is OutcomeError only when the store failed to answer: the
// answers of the contract (ErrNotFound, ErrLeaseLost, ErrFinished,
// ErrRecordChanged) are OutcomeOK with Err set.
//
// The store returned implements TxCompleter exactly when s does (its
// CompleteTx is reported as OpCompleteTx), and ConditionalDeleter exactly
// when s does (its DeleteIf is reported as OpDeleteIf). It hides every
// other method
// of s (sqlstore's List, tieredstore's Stats): Unwrap returns s for them,
// as ObservedStore does for a Store from ObserveStore.
//
// A Guard whose GuardConfig.Observer is set wraps its store with
// ObserveStore itself: use one or the other, not both.
func ObserveStore(s Store, name string, o Observer) Store {
	if o == nil || s == nil {
		return s
	}
	if name == "" {
		name = DefaultStoreName
	}
	os := &observedStore{s: s, name: name, o: o}
	txc, isTx := s.(TxCompleter)
	cd, isCD := s.(ConditionalDeleter)
	switch {
	case isTx && isCD:
		return &observedTxDeleterStore{observedTxStore: &observedTxStore{observedStore: os, txc: txc}, cd: cd}
	case isTx:
		return &observedTxStore{observedStore: os, txc: txc}
	case isCD:
		return &observedDeleterStore{observedStore: os, cd: cd}
	}
	return os
}

// DefaultStoreName is the Store of the events of a store given no name.
const DefaultStoreName = "custom"

// What a KindSweep event swept (its Op).
const (
	SweepRecords = "records"
	SweepTokens  = "tokens"
	SweepInbox   = "inbox"
	SweepOutbox  = "outbox"
)

// ObservedStore returns the store that ObserveStore wrapped into s, and
// true; or s and false if s is not a Store from ObserveStore.
func ObservedStore(s Store) (Store, bool) {
	if o := observedOf(s); o != nil {
		return o.s, true
	}
	return s, false
}

type observedStore struct {
	s    Store
	name string
	o    Observer
}

type observedTxStore struct {
	*observedStore
	txc TxCompleter
}

// observedDeleterStore observes a store with DeleteIf.
type observedDeleterStore struct {
	*observedStore
	cd ConditionalDeleter
}

// observedTxDeleterStore observes a store with CompleteTx and DeleteIf.
type observedTxDeleterStore struct {
	*observedTxStore
	cd ConditionalDeleter
}

var (
	_ Store              = (*observedStore)(nil)
	_ TxCompleter        = (*observedTxStore)(nil)
	_ ConditionalDeleter = (*observedDeleterStore)(nil)
	_ TxCompleter        = (*observedTxDeleterStore)(nil)
	_ ConditionalDeleter = (*observedTxDeleterStore)(nil)
)

// Unwrap returns the store observed.
func (s *observedStore) Unwrap() Store { return s.s }

// start reports the start of a call.
func (s *observedStore) start(ctx context.Context, op string) (context.Context, time.Time) {
	if c := s.o.Start(ctx, Event{Kind: KindStore, Op: op, Store: s.name}); c != nil {
		ctx = c
	}
	return ctx, time.Now()
}

// end reports the end of a call. kh is HashKey(scope, key) if the caller
// has it (a Guard computes it once per execution), else "" and it is
// computed here.
func (s *observedStore) end(ctx context.Context, op string, t0 time.Time, scope, key, kh string, err error) {
	outcome := OutcomeOK
	if err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrLeaseLost) && !errors.Is(err, ErrFinished) && !errors.Is(err, ErrRecordChanged) {
		outcome = OutcomeError
	}
	if kh == "" && (scope != "" || key != "") {
		kh = HashKey(scope, key)
	}
	s.o.End(ctx, Event{Kind: KindStore, Op: op, Store: s.name, Outcome: outcome,
		Duration: time.Since(t0), Err: err, KeyHash: kh})
}

func (s *observedStore) Acquire(ctx context.Context, req AcquireRequest) (AcquireResult, error) {
	return s.acquire(ctx, req, "")
}

func (s *observedStore) acquire(ctx context.Context, req AcquireRequest, kh string) (AcquireResult, error) {
	ctx, t0 := s.start(ctx, OpAcquire)
	res, err := s.s.Acquire(ctx, req)
	s.end(ctx, OpAcquire, t0, req.Scope, req.Key, kh, err)
	return res, err
}

func (s *observedStore) Complete(ctx context.Context, l Lease, resp Response, retention time.Duration) error {
	return s.complete(ctx, l, resp, retention, "")
}

func (s *observedStore) complete(ctx context.Context, l Lease, resp Response, retention time.Duration, kh string) error {
	ctx, t0 := s.start(ctx, OpComplete)
	err := s.s.Complete(ctx, l, resp, retention)
	s.end(ctx, OpComplete, t0, l.Scope, l.Key, kh, err)
	return err
}

func (s *observedStore) Release(ctx context.Context, l Lease) error { return s.release(ctx, l, "") }

func (s *observedStore) release(ctx context.Context, l Lease, kh string) error {
	ctx, t0 := s.start(ctx, OpRelease)
	err := s.s.Release(ctx, l)
	s.end(ctx, OpRelease, t0, l.Scope, l.Key, kh, err)
	return err
}

func (s *observedStore) Extend(ctx context.Context, l Lease, ttl time.Duration) (Lease, error) {
	return s.extend(ctx, l, ttl, "")
}

func (s *observedStore) extend(ctx context.Context, l Lease, ttl time.Duration, kh string) (Lease, error) {
	ctx, t0 := s.start(ctx, OpExtend)
	nl, err := s.s.Extend(ctx, l, ttl)
	s.end(ctx, OpExtend, t0, l.Scope, l.Key, kh, err)
	return nl, err
}

func (s *observedStore) Get(ctx context.Context, scope, key string) (Record, error) {
	return s.get(ctx, scope, key, "")
}

func (s *observedStore) get(ctx context.Context, scope, key, kh string) (Record, error) {
	ctx, t0 := s.start(ctx, OpGet)
	rec, err := s.s.Get(ctx, scope, key)
	s.end(ctx, OpGet, t0, scope, key, kh, err)
	return rec, err
}

func (s *observedStore) Delete(ctx context.Context, scope, key string) error {
	ctx, t0 := s.start(ctx, OpDelete)
	err := s.s.Delete(ctx, scope, key)
	s.end(ctx, OpDelete, t0, scope, key, "", err)
	return err
}

// deleteIf reports a DeleteIf of cd, the observed store's.
func (s *observedStore) deleteIf(ctx context.Context, cd ConditionalDeleter, scope, key, owner string, fence int64) error {
	ctx, t0 := s.start(ctx, OpDeleteIf)
	err := cd.DeleteIf(ctx, scope, key, owner, fence)
	s.end(ctx, OpDeleteIf, t0, scope, key, "", err)
	return err
}

func (s *observedDeleterStore) DeleteIf(ctx context.Context, scope, key, owner string, fence int64) error {
	return s.deleteIf(ctx, s.cd, scope, key, owner, fence)
}

func (s *observedTxDeleterStore) DeleteIf(ctx context.Context, scope, key, owner string, fence int64) error {
	return s.deleteIf(ctx, s.cd, scope, key, owner, fence)
}

func (s *observedStore) Sweep(ctx context.Context, limit int) (int, error) {
	sctx, t0 := s.start(ctx, OpSweep)
	n, err := s.s.Sweep(sctx, limit)
	s.end(sctx, OpSweep, t0, "", "", "", err)
	if err == nil {
		s.o.End(ctx, Event{Kind: KindSweep, Op: SweepRecords, Store: s.name, N: int64(n)})
	}
	return n, err
}

func (s *observedTxStore) CompleteTx(ctx context.Context, tx *sql.Tx, l Lease, resp Response, retention time.Duration) error {
	return s.completeTx(ctx, tx, l, resp, retention, "")
}

func (s *observedTxStore) completeTx(ctx context.Context, tx *sql.Tx, l Lease, resp Response, retention time.Duration, kh string) error {
	ctx, t0 := s.start(ctx, OpCompleteTx)
	err := s.txc.CompleteTx(ctx, tx, l, resp, retention)
	s.end(ctx, OpCompleteTx, t0, l.Scope, l.Key, kh, err)
	return err
}

// observedOf returns the observed store behind s, or nil if s is not a
// Store from ObserveStore.
func observedOf(s Store) *observedStore {
	switch o := s.(type) {
	case *observedStore:
		return o
	case *observedTxStore:
		return o.observedStore
	case *observedDeleterStore:
		return o.observedStore
	case *observedTxDeleterStore:
		return o.observedStore
	}
	return nil
}
