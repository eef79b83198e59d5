package idem_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
)

// An operator evicts the record they looked at, and nothing that replaced
// it since: DeleteIf takes the owner and fence read.
func ExampleConditionalDeleter() {
	ctx := context.Background()
	var store idem.Store = memstore.New(nil)
	req := idem.AcquireRequest{Scope: "tenant-1", Key: "order-42", Lease: 30 * time.Second, Retention: time.Hour}
	if _, err := store.Acquire(ctx, req); err != nil {
		panic(err)
	}
	seen, err := store.Get(ctx, "tenant-1", "order-42") // what the operator is shown
	if err != nil {
		panic(err)
	}

	// Meanwhile the record is evicted by someone else and a new request
	// runs with the key.
	_ = store.Delete(ctx, "tenant-1", "order-42")
	if _, err := store.Acquire(ctx, req); err != nil {
		panic(err)
	}

	cd, ok := store.(idem.ConditionalDeleter)
	if !ok {
		fmt.Println("this store can only Delete")
		return
	}
	err = cd.DeleteIf(ctx, "tenant-1", "order-42", seen.Owner, seen.Fence)
	fmt.Println("changed:", errors.Is(err, idem.ErrRecordChanged))
	_, err = store.Get(ctx, "tenant-1", "order-42")
	fmt.Println("the new request's record kept:", err == nil)
	// Output:
	// changed: true
	// the new request's record kept: true
}
