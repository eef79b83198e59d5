package tieredstore

import (
	"sync/atomic"
	"time"
)

// circuit skips Redis for a cooldown after a failure. Closed, every call
// goes to Redis. Open, calls are skipped until the cooldown ends; then one
// caller probes (the others keep skipping) and its outcome closes the
// circuit or opens it for another cooldown.
type circuit struct {
	base     time.Time // the monotonic origin of openUntil
	cooldown time.Duration
	// openUntil is when the circuit stops skipping, in nanoseconds since
	// base; 0 means closed.
	openUntil atomic.Int64
}

func newCircuit(cooldown time.Duration) *circuit {
	return &circuit{base: time.Now(), cooldown: cooldown}
}

func (c *circuit) now() int64 { return max(int64(time.Since(c.base)), 1) }

// allow reports whether a call may go to Redis.
func (c *circuit) allow() bool {
	u := c.openUntil.Load()
	if u == 0 {
		return true
	}
	now := c.now()
	if now < u {
		return false
	}
	// The cooldown is over: the caller that moves the end forward probes.
	return c.openUntil.CompareAndSwap(u, now+int64(c.cooldown))
}

// skipping reports whether the circuit is open and its cooldown runs.
func (c *circuit) skipping() bool {
	u := c.openUntil.Load()
	return u != 0 && c.now() < u
}

// fail opens the circuit for a cooldown; it reports whether the circuit
// was closed.
func (c *circuit) fail() (wasClosed bool) {
	return c.openUntil.Swap(c.now()+int64(c.cooldown)) == 0
}

// succeed closes the circuit; it reports whether it was open.
func (c *circuit) succeed() (wasOpen bool) {
	if c.openUntil.Load() == 0 {
		return false
	}
	return c.openUntil.Swap(0) != 0
}

// Stats counts what the store did with Redis since it was created.
type Stats struct {
	// Hits counts Acquire calls answered from Redis, without the truth.
	Hits uint64
	// Misses counts Acquire calls the truth answered: no usable entry, or
	// Redis failed or was skipped.
	Misses uint64
	// Errors counts Redis calls that failed or ran past Config.Timeout.
	Errors uint64
	// Trips counts the times the circuit opened: Redis was then skipped
	// for Config.Cooldown.
	Trips uint64
	// Skipped counts Redis calls not made because the circuit was open.
	Skipped uint64
}

type counters struct {
	hits, misses, errors, trips, skipped atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		Hits:    c.hits.Load(),
		Misses:  c.misses.Load(),
		Errors:  c.errors.Load(),
		Trips:   c.trips.Load(),
		Skipped: c.skipped.Load(),
	}
}
