package redisstore_test

import (
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// TestExampleSteps runs ExampleNew's steps against the test server.
func TestExampleSteps(t *testing.T) {
	store := newStore(t, singleClient(t), nil)
	ctx := t.Context()
	req := idem.AcquireRequest{Scope: "tenant-1", Key: "order-42", Fingerprint: "sha256:…", Lease: 30 * time.Second, Retention: 24 * time.Hour}
	first, err := store.Acquire(ctx, req)
	if err != nil || first.Outcome != idem.Acquired || first.Lease.Fence != 1 {
		t.Fatalf("first Acquire = %v fence %d, %v; want acquired, fence 1", first.Outcome, first.Lease.Fence, err)
	}
	if err := store.Complete(ctx, first.Lease, idem.Response{StatusCode: 201, Body: []byte(`{"id":42}`)}, 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	retry, err := store.Acquire(ctx, req)
	if err != nil || retry.Outcome != idem.Completed || retry.Record.Response.StatusCode != 201 || string(retry.Record.Response.Body) != `{"id":42}` {
		t.Fatalf("retry = %+v, %v", retry, err)
	}
}
