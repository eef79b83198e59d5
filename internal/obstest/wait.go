package obstest

import (
	"testing"
	"time"
)

// WaitBound is how long WaitFor waits before it fails the test: a guard
// against a hang, never an assertion on speed, so generous enough for a
// loaded 2-core machine.
const WaitBound = 90 * time.Second

// WaitFor polls cond every 20 ms until it holds, and fails the test
// (naming what it waited for) if it does not within WaitBound.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(WaitBound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
