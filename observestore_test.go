package idem_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
)

type evLog struct{ ends []idem.Event }

func (l *evLog) Start(ctx context.Context, _ idem.Event) context.Context { return ctx }
func (l *evLog) End(_ context.Context, e idem.Event)                     { l.ends = append(l.ends, e) }

// txStore is a store with CompleteTx, which fails.
type txStore struct{ idem.Store }

var errTx = errors.New("tx refused")

func (txStore) CompleteTx(context.Context, *sql.Tx, idem.Lease, idem.Response, time.Duration) error {
	return errTx
}

// TestObserveStore: each call is reported with its op, the store's name,
// the key's hash and an outcome that is "error" only for a failure (not
// for ErrNotFound); a Sweep reports its count; TxCompleter is kept
// exactly when the inner store has it; Unwrap gives the inner store.
func TestObserveStore(t *testing.T) {
	ctx := context.Background()
	clock := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	inner := memstore.New(&memstore.Config{Now: func() time.Time { return clock }})
	log := &evLog{}
	s := idem.ObserveStore(inner, "memory", log)
	if _, ok := s.(idem.TxCompleter); ok {
		t.Fatal("a memstore wrapped has CompleteTx")
	}
	if u, ok := idem.ObservedStore(s); !ok || u != idem.Store(inner) {
		t.Fatal("ObservedStore does not give the inner store")
	}
	res, err := s.Acquire(ctx, idem.AcquireRequest{Scope: "sc", Key: "k", Fingerprint: "f", Lease: time.Second, Retention: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, res.Lease, idem.Response{StatusCode: 201}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "sc", "missing"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatal(err)
	}
	clock = clock.Add(time.Hour)
	if n, err := s.Sweep(ctx, 0); err != nil || n != 1 {
		t.Fatalf("sweep %d, %v", n, err)
	}
	want := []struct {
		kind              idem.Kind
		op, outcome, hash string
		n                 int64
	}{
		{idem.KindStore, idem.OpAcquire, idem.OutcomeOK, idem.HashKey("sc", "k"), 0},
		{idem.KindStore, idem.OpComplete, idem.OutcomeOK, idem.HashKey("sc", "k"), 0},
		{idem.KindStore, idem.OpGet, idem.OutcomeOK, idem.HashKey("sc", "missing"), 0},
		{idem.KindStore, idem.OpSweep, idem.OutcomeOK, "", 0},
		{idem.KindSweep, idem.SweepRecords, "", "", 1},
	}
	if len(log.ends) != len(want) {
		t.Fatalf("events %+v", log.ends)
	}
	for i, w := range want {
		e := log.ends[i]
		if e.Kind != w.kind || e.Op != w.op || e.Outcome != w.outcome || e.KeyHash != w.hash || e.N != w.n || e.Store != "memory" {
			t.Errorf("event %d: %+v, want %+v", i, e, w)
		}
	}

	log.ends = nil
	tx := idem.ObserveStore(txStore{inner}, "", log)
	txc, ok := tx.(idem.TxCompleter)
	if !ok {
		t.Fatal("a store with CompleteTx lost it when wrapped")
	}
	if err := txc.CompleteTx(ctx, nil, idem.Lease{Scope: "a", Key: "b"}, idem.Response{}, time.Minute); !errors.Is(err, errTx) {
		t.Fatal(err)
	}
	if e := log.ends; len(e) != 1 || e[0].Op != idem.OpCompleteTx || e[0].Outcome != idem.OutcomeError || e[0].Store != idem.DefaultStoreName || !errors.Is(e[0].Err, errTx) {
		t.Fatalf("CompleteTx events %+v", e)
	}
	if idem.ObserveStore(inner, "x", nil) != idem.Store(inner) {
		t.Error("a nil Observer wraps the store")
	}
}

// txDeleterStore is a memstore with CompleteTx (which fails) and its own
// DeleteIf.
type txDeleterStore struct {
	txStore
	cd idem.ConditionalDeleter
}

func (s txDeleterStore) DeleteIf(ctx context.Context, scope, key, owner string, fence int64) error {
	return s.cd.DeleteIf(ctx, scope, key, owner, fence)
}

// TestObserveStoreDeleteIf: the wrapper implements ConditionalDeleter
// exactly when the inner store does, with or without TxCompleter; DeleteIf
// is reported as OpDeleteIf, ErrRecordChanged and ErrNotFound as answers
// (OutcomeOK), and it deletes only the record named.
func TestObserveStoreDeleteIf(t *testing.T) {
	ctx := context.Background()
	inner := memstore.New(nil)
	log := &evLog{}
	for _, c := range []struct {
		name     string
		s        idem.Store
		tx, cond bool
	}{
		{"memstore", inner, false, true},
		{"tx only", txStore{inner}, true, false},
		{"tx and DeleteIf", txDeleterStore{txStore{inner}, inner}, true, true},
		{"neither", struct{ idem.Store }{inner}, false, false},
	} {
		s := idem.ObserveStore(c.s, "memory", log)
		_, tx := s.(idem.TxCompleter)
		cd, cond := s.(idem.ConditionalDeleter)
		if tx != c.tx || cond != c.cond {
			t.Fatalf("%s wrapped: TxCompleter %v, ConditionalDeleter %v; want %v, %v", c.name, tx, cond, c.tx, c.cond)
		}
		if u, ok := idem.ObservedStore(s); !ok || u != c.s {
			t.Fatalf("%s: ObservedStore does not give the inner store", c.name)
		}
		if !cond {
			continue
		}
		res, err := s.Acquire(ctx, idem.AcquireRequest{Scope: "sc", Key: c.name, Fingerprint: "f", Lease: time.Minute, Retention: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		log.ends = nil
		if err := cd.DeleteIf(ctx, "sc", c.name, res.Lease.Owner, res.Lease.Fence+1); !errors.Is(err, idem.ErrRecordChanged) {
			t.Fatalf("%s: DeleteIf of another fence = %v, want ErrRecordChanged", c.name, err)
		}
		if _, err := inner.Get(ctx, "sc", c.name); err != nil {
			t.Fatalf("%s: the record went after a refused DeleteIf: %v", c.name, err)
		}
		if err := cd.DeleteIf(ctx, "sc", c.name, res.Lease.Owner, res.Lease.Fence); err != nil {
			t.Fatalf("%s: DeleteIf: %v", c.name, err)
		}
		if _, err := inner.Get(ctx, "sc", c.name); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("%s: the record is still there after DeleteIf: %v", c.name, err)
		}
		if err := cd.DeleteIf(ctx, "sc", c.name, res.Lease.Owner, res.Lease.Fence); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("%s: DeleteIf of nothing = %v", c.name, err)
		}
		if len(log.ends) != 3 {
			t.Fatalf("%s: events %+v, want 3", c.name, log.ends)
		}
		for i, e := range log.ends {
			if e.Kind != idem.KindStore || e.Op != idem.OpDeleteIf || e.Outcome != idem.OutcomeOK || e.KeyHash != idem.HashKey("sc", c.name) || e.Store != "memory" {
				t.Errorf("%s: event %d: %+v", c.name, i, e)
			}
		}
	}
}
