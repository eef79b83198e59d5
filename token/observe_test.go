package token_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/token"
)

func TestObserver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := &obstest.Recorder{}
	mem := token.NewMemoryStore()
	tk, err := token.New(mem, &token.Config{Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tk.Issue(ctx, "user-alice")
	if err != nil {
		t.Fatal(err)
	}
	if err := tk.Consume(ctx, "user-alice", tok.ID, token.Use{Request: []byte("a"), Result: []byte("order-1")}); err != nil {
		t.Fatal(err)
	}
	if err := tk.Consume(ctx, "user-alice", tok.ID, token.Use{Request: []byte("b")}); !errors.Is(err, token.ErrMismatch) {
		t.Fatalf("Consume with another request: %v, want ErrMismatch", err)
	}
	if err := tk.Consume(ctx, "user-alice", tok.ID, token.Use{}); !errors.Is(err, token.ErrUsed) {
		t.Fatalf("second Consume: %v, want ErrUsed", err)
	}
	if err := tk.Consume(ctx, "user-bob", tok.ID, token.Use{}); !errors.Is(err, token.ErrInvalid) {
		t.Fatalf("Consume under another scope: %v, want ErrInvalid", err)
	}
	if err := tk.Consume(ctx, "user-alice", "not a token", token.Use{}); !errors.Is(err, token.ErrInvalid) {
		t.Fatalf("Consume of garbage: %v, want ErrInvalid", err)
	}
	// A mistake of the caller is no consume.
	if err := tk.Consume(ctx, "", tok.ID, token.Use{}); !errors.Is(err, token.ErrScope) {
		t.Fatalf("Consume without scope: %v", err)
	}
	failing, err := token.New(failingStore{}, &token.Config{Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	if err := failing.Consume(ctx, "user-alice", tok.ID, token.Use{}); !errors.Is(err, errDown) {
		t.Fatalf("Consume on a failing store: %v", err)
	}

	want := []string{idem.OutcomeIssued, idem.OutcomeOK, idem.OutcomeConsumed, idem.OutcomeMismatch, idem.OutcomeUsed, idem.OutcomeInvalid, idem.OutcomeInvalid, idem.OutcomeError}
	if got := rec.Outcomes(idem.KindToken); !slices.Equal(got, want) {
		t.Fatalf("outcomes %q, want %q", got, want)
	}
	ends := rec.Ends(idem.KindToken)
	if e := ends[1]; e.Op != idem.OpTrim || e.N != 0 {
		t.Fatalf("end 1: %+v, want the issue's trim, nothing removed", e)
	}
	if ends[3].Err != nil {
		t.Fatalf("mismatch reported as an error: %v", ends[3].Err)
	}
	// Without the trim and the mismatch, the checks below are the old ones.
	ends = append(ends[:1:1], ends[2], ends[4], ends[5], ends[6], ends[7])
	d, _ := token.Digest(tok.ID)
	for i, e := range ends {
		wantOp := idem.OpConsume
		if i == 0 { // the trim was taken out above
			wantOp = idem.OpIssue
		}
		if e.Op != wantOp {
			t.Errorf("end %d: Op %q, want %q", i, e.Op, wantOp)
		}
		for _, f := range []string{e.Route, e.Store, e.KeyHash, e.Outcome} {
			if strings.Contains(f, "alice") || strings.Contains(f, tok.ID) || strings.Contains(f, d) {
				t.Errorf("end %d: %q names the scope or the token", i, f)
			}
		}
	}
	if h := idem.HashKey("user-alice", d); ends[0].KeyHash != h || ends[1].KeyHash != h || ends[3].KeyHash == h || ends[4].KeyHash != "" {
		t.Fatalf("KeyHashes %q, %q, %q, %q: want the token's under its scope, another under another scope, none for garbage",
			ends[0].KeyHash, ends[1].KeyHash, ends[3].KeyHash, ends[4].KeyHash)
	}
	if ends[5].Err == nil || ends[2].Err != nil {
		t.Fatalf("errors: used %v, failed %v: want only the store's failure", ends[2].Err, ends[5].Err)
	}
	calls := rec.Calls()
	for i := 1; i < len(calls); i += 2 {
		if calls[i].Parent != calls[i-1].Mark {
			t.Fatalf("End %d not on its Start's context", i)
		}
	}
}
