package tieredstore_test

import (
	"encoding/base64"
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
