package steps_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
	"github.com/idemkit/idem/steps"
)

// An operation answers in its API's own shape (a 201, a 402 for a
// definite refusal) when OpConfig.Encode says so: that is what the
// record holds, and Decode reads it back for a duplicate.
func TestCustomEncoding(t *testing.T) {
	ctx := context.Background()
	store := memstore.New(nil)
	g, _ := idem.NewGuard(store, nil)
	j, _ := steps.NewMemory(store)
	r, _ := steps.New(g, j, nil)
	refused := &idem.DefiniteError{Code: "refused"}
	runs := 0
	op, err := steps.Define(r, "custom", func(ctx context.Context, s *steps.Run, in int) (int, error) {
		runs++
		if in < 0 {
			return 0, refused
		}
		return in * 2, nil
	}, &steps.OpConfig[int, int]{
		Key: func(in int) (string, string, error) { return "", "custom-" + string(rune('a'+in+5)), nil },
		Encode: func(out int, err error) (idem.Response, error, bool) {
			if errors.Is(err, refused) {
				return idem.Response{StatusCode: 402, Body: []byte(`"refused"`)}, err, true
			}
			if err != nil {
				return idem.Response{}, err, false
			}
			b, _ := json.Marshal(out)
			return idem.Response{StatusCode: 201, Body: b}, nil, true
		},
		Decode: func(resp idem.Response, replayed bool) (int, error) {
			if resp.StatusCode == 402 {
				return 0, &idem.DefiniteError{Code: "refused", Replayed: replayed}
			}
			var n int
			err := json.Unmarshal(resp.Body, &n)
			return n, err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if out, _, err := op.Call(ctx, 3); err != nil || out != 6 {
			t.Fatalf("Call(3): %d, %v", out, err)
		}
		if _, _, err := op.Call(ctx, -1); !errors.Is(err, refused) {
			t.Fatalf("Call(-1): %v, want refused", err)
		}
	}
	if runs != 2 {
		t.Fatalf("the operation ran %d times, want 2 (once per key)", runs)
	}
	for key, want := range map[string]int{"custom-i": 201, "custom-e": 402} {
		rec, err := store.Get(ctx, "", key)
		if err != nil || rec.Response == nil || rec.Response.StatusCode != want {
			t.Fatalf("record %s: %+v, %v; want status %d", key, rec, err, want)
		}
	}
}
