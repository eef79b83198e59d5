package admin

import (
	"cmp"
	"context"
	"slices"
	"sync"

	"github.com/idemkit/idem"
)

// Counters is an idem.Observer that counts the operations that ended, by
// kind, route, operation and outcome (Event's bounded labels), for the
// operator page's live counters. Set it as the Observer of the parts to
// watch (idem.Observers combines it with a metrics or tracing adapter's).
// It keeps nothing else: no key, no error text. The zero value is ready
// to use; it is safe for concurrent use.
type Counters struct {
	mu sync.Mutex
	m  map[CountKey]int64
}

var _ idem.Observer = (*Counters)(nil)

// CountKey is what Counters counts by: the labels of an idem.Event.
type CountKey struct {
	Kind    string
	Route   string
	Op      string
	Outcome string
}

// Count is one counter.
type Count struct {
	CountKey
	N int64
}

// Start returns ctx: Counters counts operations when they end.
func (c *Counters) Start(ctx context.Context, _ idem.Event) context.Context { return ctx }

// End counts e, if it has an outcome (an instant without one, such as an
// outbox's backlog, is not a count).
func (c *Counters) End(_ context.Context, e idem.Event) {
	if e.Outcome == "" {
		return
	}
	k := CountKey{Kind: e.Kind.String(), Route: e.Route, Op: e.Op, Outcome: e.Outcome}
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[CountKey]int64)
	}
	c.m[k]++
	c.mu.Unlock()
}

// Snapshot returns the counters, sorted by kind, route, operation and
// outcome.
func (c *Counters) Snapshot() []Count {
	c.mu.Lock()
	out := make([]Count, 0, len(c.m))
	for k, n := range c.m {
		out = append(out, Count{CountKey: k, N: n})
	}
	c.mu.Unlock()
	slices.SortFunc(out, func(a, b Count) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Route, b.Route), cmp.Compare(a.Op, b.Op), cmp.Compare(a.Outcome, b.Outcome))
	})
	return out
}
