package idem_test

import (
	"context"
	"testing"

	"github.com/idemkit/idem"
)

func TestHashKey(t *testing.T) {
	a := idem.HashKey("tenant", "k-1")
	if len(a) != 16 || a != idem.HashKey("tenant", "k-1") {
		t.Fatalf("HashKey = %q, want 16 stable hex digits", a)
	}
	// Length prefixes keep the split between scope and key.
	for _, other := range []string{idem.HashKey("tenantk", "-1"), idem.HashKey("", "tenantk-1"), idem.HashKey("tenant", "k-2")} {
		if other == a {
			t.Fatalf("two different (scope, key) pairs share %q", a)
		}
	}
	if want := "e3b0c44298fc1c14"; idem.HashKey("", "") == want {
		t.Fatal("HashKey of empty fields must not be the SHA-256 of nothing: the lengths are hashed too")
	}
}

type recordObs struct {
	name string
	log  *[]string
}

type ctxKey struct{}

func (r recordObs) Start(ctx context.Context, e idem.Event) context.Context {
	*r.log = append(*r.log, r.name+" start "+e.Kind.String()+" "+e.Op)
	return context.WithValue(ctx, ctxKey{}, r.name)
}

func (r recordObs) End(ctx context.Context, e idem.Event) {
	from, _ := ctx.Value(ctxKey{}).(string)
	*r.log = append(*r.log, r.name+" end "+e.Outcome+" ctx from "+from)
}

func TestObservers(t *testing.T) {
	if idem.Observers() != nil || idem.Observers(nil, nil) != nil {
		t.Fatal("Observers of nothing must be nil, so that callers skip it")
	}
	var log []string
	a := recordObs{"a", &log}
	if o := idem.Observers(nil, a); o != idem.Observer(a) {
		t.Fatalf("Observers of one = %v, want it itself", o)
	}
	o := idem.Observers(a, nil, recordObs{"b", &log})
	ctx := o.Start(context.Background(), idem.Event{Kind: idem.KindStore, Op: idem.OpAcquire})
	o.End(ctx, idem.Event{Kind: idem.KindStore, Op: idem.OpAcquire, Outcome: idem.OutcomeOK})
	want := []string{"a start store acquire", "b start store acquire", "a end ok ctx from b", "b end ok ctx from b"}
	if len(log) != len(want) {
		t.Fatalf("log %q, want %q", log, want)
	}
	for i := range want {
		if log[i] != want[i] {
			t.Fatalf("log %q, want %q", log, want)
		}
	}
}

func TestKindString(t *testing.T) {
	for k, want := range map[idem.Kind]string{idem.KindRequest: "request", idem.KindOutbox: "outbox", 0: "unknown", 200: "unknown"} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", k, got, want)
		}
	}
}
