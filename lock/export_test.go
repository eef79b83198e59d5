package lock

import "time"

// SuspendFor makes the lease's wall clock run d ahead of the machine's
// while its monotonic clock does not move, as after the machine was
// suspended for d (CLOCK_MONOTONIC, Go's monotonic clock on Linux, stops
// during a suspend; the wall clock, and the backend's, go on). The
// returned func undoes it. Tests that call it must not run in parallel;
// the watchdog may run meanwhile.
func SuspendFor(d time.Duration) (undo func()) {
	wallSkew.Add(int64(d))
	return func() { wallSkew.Add(-int64(d)) }
}
