package token_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/token"
)

// TestObserverNilStart: an Observer whose Start returns nil (taken for
// the context given) does not break tokens: one is issued, consumed
// once, and refused the second time.
func TestObserverNilStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obs := &obstest.NilStart{}
	tk, err := token.New(token.NewMemoryStore(), &token.Config{Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tk.Issue(ctx, "user-alice")
	if err != nil {
		t.Fatalf("Issue: %v", err)
	}
	if err := tk.Consume(ctx, "user-alice", tok.ID, token.Use{}); err != nil {
		t.Fatalf("Consume: %v", err)
	}
	if err := tk.Consume(ctx, "user-alice", tok.ID, token.Use{}); !errors.Is(err, token.ErrUsed) {
		t.Fatalf("second Consume: %v, want ErrUsed", err)
	}
	if obs.Ends() != 4 { // issue, its trim, two consumes
		t.Fatalf("%d ends, want 4", obs.Ends())
	}
}
