// Package killsoak holds the tests that kill shopd processes and soak
// them: two shopd instances on one PostgreSQL database of the test's own,
// with the machine's Redis in front (tieredstore) and the machine's NATS
// as the broker, under mixed traffic (orders, token checkouts, coupons,
// payment callbacks sent more than once, cancellations, refunds) from
// clients that retry with the same Idempotency-Key on the other instance,
// as behind a load balancer.
//
// TestKillLoop kills an instance with SIGKILL every few seconds
// (alternating) and starts it again on the same port. TestSoak runs the
// same traffic at a fixed rate with faults every few seconds: a kill, or
// a connection fault (drop, reset, stall, latency, refusal, a lost reply)
// between shopd and PostgreSQL, Redis or NATS, or between the clients and
// shopd, through internal/netfault proxies. Both end by checking the
// shop's invariants in the database (one order per key, stock conserved,
// one payment per paid order, coupon uses within limits, points granted
// and taken back once, every event published and consumed once, every
// answer a client got in the database) and print their figures. The
// package has no code of its own; see its tests.
package killsoak
