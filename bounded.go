package idem

import (
	"context"
	"sync"
	"time"
)

// boundedContext is parent with a deadline, armed lazily: its timer and its
// watch of the parent start only when a store asks for Done, so a store
// that only checks Err (memstore) pays no allocation for the bound, and a
// network store pays it next to a round trip. Each serves one call (init,
// use, release) and is never reused: a goroutine the store started (the
// one context.WithCancel starts for a foreign parent) may still ask it for
// Done after the call; it then gets a closed channel.
type boundedContext struct {
	parent   context.Context
	deadline time.Time

	mu         sync.Mutex
	released   bool
	done       chan struct{}
	err        error
	timer      *time.Timer
	stopParent func() bool
}

func (c *boundedContext) init(parent context.Context, timeout time.Duration) {
	c.parent = parent
	c.deadline = time.Now().Add(timeout)
	if d, ok := parent.Deadline(); ok && d.Before(c.deadline) {
		c.deadline = d
	}
}

var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// release ends the call: it stops the timer and the watch of the parent,
// and from then on the context is done.
func (c *boundedContext) release() {
	c.mu.Lock()
	c.released = true
	// A Done handed out during the call closes now: whatever still
	// watches it (a goroutine the store started) must end.
	c.finishLocked(context.Canceled)
	t, stop := c.timer, c.stopParent
	c.mu.Unlock()
	if t != nil {
		t.Stop()
	}
	if stop != nil {
		stop()
	}
}

func (c *boundedContext) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *boundedContext) Value(key any) any           { return c.parent.Value(key) }

func (c *boundedContext) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		return c.done
	}
	if c.released {
		return closedChan
	}
	c.done = make(chan struct{})
	if err := c.clockErr(); err != nil {
		c.finishLocked(err)
		return c.done
	}
	c.timer = time.AfterFunc(time.Until(c.deadline), func() { c.finish(context.DeadlineExceeded) })
	if c.parent.Done() != nil {
		parent := c.parent
		c.stopParent = context.AfterFunc(parent, func() { c.finish(parent.Err()) })
	}
	return c.done
}

func (c *boundedContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		return c.err
	}
	if c.released {
		return context.Canceled
	}
	// Not armed: what Done would say at once if it were asked now.
	return c.clockErr()
}

// clockErr is the parent's error, or DeadlineExceeded once the deadline has
// passed. c.mu held.
func (c *boundedContext) clockErr() error {
	if err := c.parent.Err(); err != nil {
		return err
	}
	if !time.Now().Before(c.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

func (c *boundedContext) finish(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.finishLocked(err)
}

func (c *boundedContext) finishLocked(err error) {
	if c.err == nil && c.done != nil {
		c.err = err
		close(c.done)
	}
}
