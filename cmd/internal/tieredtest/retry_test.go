package tieredtest_test

import (
	"encoding/base64"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
	"github.com/idemkit/idem/tieredstore"
)

// TestRetriedCompleteEntryTTL: a Complete retried after its first call
// committed in the truth (the reply was lost) caches the record as the
// truth stored it, with its first ExpiresAt; the entry must not outlive
// that ExpiresAt, whatever retention the retry passes, or a retry long
// after the first completion would cache it for a whole retention more.
func TestRetriedCompleteEntryTTL(t *testing.T) {
	t.Parallel()
	_, sqlTruth := newTruth(t)
	for name, truth := range map[string]idem.Store{"record completer": sqlTruth, "memstore": memstore.New(nil)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			retriedComplete(t, truth)
		})
	}
}

func retriedComplete(t *testing.T, truth idem.Store) {
	rc := redisClient(t)
	prefix := randomPrefix()
	s := newTiered(t, rc, rc, truth, &tieredstore.Config{Prefix: prefix})
	ctx := t.Context()
	req := idem.AcquireRequest{Scope: "t", Key: "k", Fingerprint: "fp", Lease: time.Hour, Retention: time.Hour}
	res, err := s.Acquire(ctx, req)
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("Acquire = %v, %v", res.Outcome, err)
	}
	// The first completion commits in the truth; its reply is lost.
	const first = 10 * time.Minute
	if err := truth.Complete(ctx, res.Lease, idem.Response{StatusCode: 201, Body: []byte("first")}, first); err != nil {
		t.Fatal(err)
	}
	// The retry, through the tiered store, with the configured retention.
	if err := s.Complete(ctx, res.Lease, idem.Response{StatusCode: 201, Body: []byte("retry")}, time.Hour); err != nil {
		t.Fatalf("retried Complete: %v", err)
	}
	rec, err := truth.Get(ctx, "t", "k")
	if err != nil || string(rec.Response.Body) != "first" {
		t.Fatalf("truth = %+v, %v; want the first completion", rec, err)
	}
	name := prefix + ":{" + base64.RawURLEncoding.EncodeToString([]byte("t")) + "." + base64.RawURLEncoding.EncodeToString([]byte("k")) + "}"
	ttl, err := rc.PTTL(ctx, name).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Redis counts the TTL in whole milliseconds on its own clock: allow
	// a second (the broken store cached this entry for 50 minutes more).
	if limit := time.Until(rec.ExpiresAt); ttl > limit+time.Second {
		t.Fatalf("PTTL of the completed entry = %v; the truth's record expires in %v", ttl, limit)
	}
	got, err := s.Acquire(ctx, req)
	if err != nil || got.Outcome != idem.Completed || string(got.Record.Response.Body) != "first" {
		t.Fatalf("replay = %v %+v, %v; want the first response", got.Outcome, got.Record.Response, err)
	}
}

// TestRetriedCompleteTxDropsInFlightEntry: a CompleteTx retried after the
// first one committed (its reply lost) fails with idem.ErrFinished; the
// record is completed, so the in-flight entry must go as it does after a
// successful CompleteTx, or the retries of the client would be answered
// InFlight (409) instead of the stored response until the entry's TTL.
func TestRetriedCompleteTxDropsInFlightEntry(t *testing.T) {
	t.Parallel()
	rc := redisClient(t)
	db, truth := newTruth(t)
	s := newTiered(t, rc, rc, truth, &tieredstore.Config{MarkerTTL: time.Hour})
	txc := s.(idem.TxCompleter)
	ctx := t.Context()
	req := idem.AcquireRequest{Scope: "t", Key: "k", Fingerprint: "fp", Lease: time.Hour, Retention: time.Hour}
	res, err := s.Acquire(ctx, req)
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("Acquire = %v, %v", res.Outcome, err)
	}
	// The first completion commits in the truth; its reply is lost.
	if err := truth.Complete(ctx, res.Lease, idem.Response{StatusCode: 201, Body: []byte("first")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = txc.CompleteTx(ctx, tx, res.Lease, idem.Response{StatusCode: 201, Body: []byte("retry")}, time.Hour)
	_ = tx.Rollback()
	if !errors.Is(err, idem.ErrFinished) {
		t.Fatalf("retried CompleteTx = %v, want idem.ErrFinished", err)
	}
	got, err := s.Acquire(ctx, req)
	if err != nil || got.Outcome != idem.Completed || string(got.Record.Response.Body) != "first" {
		t.Fatalf("replay after the retried CompleteTx = %v %+v, %v; want the first response", got.Outcome, got.Record.Response, err)
	}
}
