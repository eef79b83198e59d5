package idem_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
)

// countingTxStore is a memstore whose CompleteTx completes at once (as if its
// transaction committed) and counts the Gets that Committed makes.
type countingTxStore struct {
	*memstore.Store
	gets int
}

func (s *countingTxStore) CompleteTx(ctx context.Context, _ *sql.Tx, l idem.Lease, resp idem.Response, retention time.Duration) error {
	return s.Store.Complete(ctx, l, resp, retention)
}

func (s *countingTxStore) Get(ctx context.Context, scope, key string) (idem.Record, error) {
	s.gets++
	return s.Store.Get(ctx, scope, key)
}

// After Confirm, Committed answers from the execution without asking the
// store; without it, it asks once.
func TestConfirmSavesTheRead(t *testing.T) {
	ctx := context.Background()
	for _, confirm := range []bool{false, true} {
		st := &countingTxStore{Store: memstore.New(nil)}
		g, err := idem.NewGuard(st, nil)
		if err != nil {
			t.Fatal(err)
		}
		x, _, err := g.Begin(ctx, "", "k", "fp")
		if err != nil {
			t.Fatal(err)
		}
		if err := x.CompleteTx(ctx, nil, idem.Response{StatusCode: 201}); err != nil {
			t.Fatal(err)
		}
		if confirm {
			x.Confirm()
		}
		resp, ok, err := x.Committed(ctx)
		if err != nil || !ok || resp.StatusCode != 201 {
			t.Fatalf("confirm %v: Committed = %+v, %v, %v", confirm, resp, ok, err)
		}
		if want := map[bool]int{false: 1, true: 0}[confirm]; st.gets != want {
			t.Fatalf("confirm %v: %d reads of the store, want %d", confirm, st.gets, want)
		}
		if x.Context().Err() == nil {
			t.Fatalf("confirm %v: the execution's context is live after it ended", confirm)
		}
	}
}
