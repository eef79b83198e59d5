// Package retry holds the backoff of the watchdogs that renew leases (the
// guard's, the lock's, the inbox's).
package retry

import "time"

// After is how long a watchdog waits after a failed renewal, given prev,
// its wait after the failure before (0 if the renewal before succeeded),
// and the lease: a thirtieth of the lease (at least a millisecond) after
// a first failure, doubled after each further failure in a row, at most a
// third. The caller bounds it by the lease's end.
//
// A renewal that timed out used up a third of the lease (its attempt is
// bounded so): a retry a third later, as after a success, would come at
// the lease's end, too late to save it, so one round trip slower than a
// third of the lease would lose a lease of which a third remained. The
// backoff keeps a store that fails at once from being called in a tight
// loop.
func After(prev, lease time.Duration) time.Duration {
	if prev == 0 {
		return max(lease/30, time.Millisecond)
	}
	return min(2*prev, lease/3)
}
