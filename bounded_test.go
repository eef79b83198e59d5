package idem

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestBoundedContextDeadline(t *testing.T) {
	var c boundedContext
	start := time.Now()
	c.init(context.Background(), 30*time.Millisecond)
	// Nil until the timeout (a loaded machine may get here later).
	if err := c.Err(); err != nil && time.Since(start) < 30*time.Millisecond {
		t.Fatalf("fresh: Err = %v", err)
	}
	if d, ok := c.Deadline(); !ok || time.Until(d) > 30*time.Millisecond {
		t.Fatalf("Deadline = %v, %v", d, ok)
	}
	select {
	case <-c.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("Done not closed after the timeout")
	}
	if !errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err = %v, want DeadlineExceeded", c.Err())
	}
	c.release()

	// After release, a late Done (a store's goroutine) is closed at once.
	var late boundedContext
	late.init(context.Background(), time.Hour)
	late.release()
	select {
	case <-late.Done():
	default:
		t.Fatal("Done open after release")
	}
	if late.Err() == nil {
		t.Fatal("Err nil after release")
	}
}

func TestBoundedContextUnarmed(t *testing.T) {
	// Without a call to Done the deadline still shows in Err, and a later
	// Done is closed at once.
	var c boundedContext
	c.init(context.Background(), 5*time.Millisecond)
	time.Sleep(10 * time.Millisecond)
	if !errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err = %v", c.Err())
	}
	select {
	case <-c.Done():
	default:
		t.Fatal("Done open after the deadline")
	}
	c.release()
}

func TestBoundedContextParent(t *testing.T) {
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	var c boundedContext
	c.init(parent, time.Hour)
	if c.Value(ctxKey{}) != "v" {
		t.Fatal("values of the parent are not visible")
	}
	done := c.Done()
	cancel()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Done not closed after the parent was cancelled")
	}
	if !errors.Is(c.Err(), context.Canceled) {
		t.Fatalf("Err = %v, want Canceled", c.Err())
	}
	c.release()

	// A parent with an earlier deadline wins.
	p2, cancel2 := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel2()
	var c2 boundedContext
	c2.init(p2, time.Hour)
	if d, _ := c2.Deadline(); time.Until(d) > time.Second {
		t.Fatalf("Deadline %v ignores the parent's", d)
	}
	c2.release()
}
