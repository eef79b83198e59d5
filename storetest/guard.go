package storetest

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
)

type doResult struct {
	resp     idem.Response
	replayed bool
	err      error
}

var guardCases = []testCase{
	{name: "GuardDo", run: func(h *harness) {
		g := h.guard()
		var runs atomic.Int64
		work := func(ctx context.Context) (idem.Response, error) {
			n := runs.Add(1)
			return idem.Response{StatusCode: 200, Body: []byte{byte(n)}}, nil
		}
		first, replayed, err := g.Do(h.ctx, h.scope, "k", "fp", work)
		if err != nil || replayed {
			h.Fatalf("first Do: replayed %v, %v", replayed, err)
		}
		second, replayed, err := g.Do(h.ctx, h.scope, "k", "fp", work)
		if err != nil || !replayed || diffResponse(&second, first) != "" {
			h.Fatalf("second Do = %+v, replayed %v, %v; want a replay of %+v", second, replayed, err, first)
		}
		if _, _, err := g.Do(h.ctx, h.scope, "k", "other", work); !errors.Is(err, idem.ErrMismatch) {
			h.Fatalf("Do with another fingerprint = %v, want idem.ErrMismatch", err)
		}
		if n := runs.Load(); n != 1 {
			h.Fatalf("work ran %d times, want 1", n)
		}
	}},

	{name: "GuardDoRace", run: func(h *harness) {
		g := h.guard()
		var runs atomic.Int64
		want := idem.Response{StatusCode: 201, Body: []byte("effect")}
		out := race(50, func(int) doResult {
			resp, replayed, err := g.Do(h.ctx, h.scope, "k", "fp", func(ctx context.Context) (idem.Response, error) {
				runs.Add(1)
				time.Sleep(50 * time.Millisecond)
				return want, nil
			})
			return doResult{resp, replayed, err}
		})
		ran := 0
		for _, o := range out {
			switch {
			case o.err == nil && !o.replayed:
				ran++
			case o.err == nil && o.replayed:
				if d := diffResponse(&o.resp, want); d != "" {
					h.Fatalf("replay: %s", d)
				}
			case errors.Is(o.err, idem.ErrInFlight):
			default:
				h.Fatalf("Do: %v", o.err)
			}
		}
		if n := runs.Load(); n != 1 || ran != 1 {
			h.Fatalf("work ran %d times and %d calls say they ran it; want 1 and 1", n, ran)
		}
	}},
}
