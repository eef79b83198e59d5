// Package obstest records what an idem.Observer is told, for the tests of
// the packages that report to one.
package obstest

import (
	"context"
	"sync"

	"github.com/idemkit/idem"
)

// Call is one call an Observer received.
type Call struct {
	// Start is true for Start, false for End.
	Start bool
	Event idem.Event
	// Parent is the Recorder's mark on the context of the call: the
	// number of the Start whose context it descends from (0: none).
	Parent int
	// Mark is the number this call gave its context (Start only, from 1).
	Mark int
}

type markKey struct{}

// Mark returns the mark a Recorder's Start put on ctx (0: none).
func Mark(ctx context.Context) int {
	m, _ := ctx.Value(markKey{}).(int)
	return m
}

// Recorder is an idem.Observer that keeps every call. Its Start marks the
// context it returns, so that a test can tell which Start the context of
// a later call descends from. It is safe for concurrent use.
type Recorder struct {
	mu    sync.Mutex
	calls []Call
	marks int
}

// Start implements idem.Observer.
func (r *Recorder) Start(ctx context.Context, e idem.Event) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.marks++
	r.calls = append(r.calls, Call{Start: true, Event: e, Parent: Mark(ctx), Mark: r.marks})
	return context.WithValue(ctx, markKey{}, r.marks)
}

// End implements idem.Observer.
func (r *Recorder) End(ctx context.Context, e idem.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, Call{Event: e, Parent: Mark(ctx)})
}

// Calls returns the calls so far, in order.
func (r *Recorder) Calls() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Call(nil), r.calls...)
}

// Ends returns the events of the End calls of kind, in order.
func (r *Recorder) Ends(kind idem.Kind) []idem.Event {
	var out []idem.Event
	for _, c := range r.Calls() {
		if !c.Start && c.Event.Kind == kind {
			out = append(out, c.Event)
		}
	}
	return out
}

// Outcomes returns the outcomes of the End calls of kind, in order.
func (r *Recorder) Outcomes(kind idem.Kind) []string {
	var out []string
	for _, e := range r.Ends(kind) {
		out = append(out, e.Outcome)
	}
	return out
}

// NilStart is an idem.Observer whose Start returns a nil context (taken
// for the context it was given) and whose End counts the ends. It is safe
// for concurrent use.
type NilStart struct {
	mu   sync.Mutex
	ends int
}

// Start implements idem.Observer: it returns nil.
func (n *NilStart) Start(context.Context, idem.Event) context.Context { return nil }

// End implements idem.Observer.
func (n *NilStart) End(context.Context, idem.Event) {
	n.mu.Lock()
	n.ends++
	n.mu.Unlock()
}

// Ends returns the number of ends so far.
func (n *NilStart) Ends() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ends
}
