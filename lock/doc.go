// Package lock gives leases on named locks: an owner token, a fencing
// token, and a watchdog that renews the lease while it is held.
//
// A Locker acquires a lock on a Backend (Acquire waits with backoff and
// jitter while another owner holds it, TryAcquire tries once) and returns
// a Lease. The lease's watchdog renews it every third of the TTL, up to
// the maximum hold; Done closes, and the contexts of Lease.Context are
// cancelled, when the lease is lost (cause ErrLost), runs out at the
// maximum hold (ErrMaxHold) or is released (ErrReleased). Release and
// renewal are compare-and-delete and compare-and-extend on the owner
// token and the fence: nobody but the holder can end or extend a lease.
//
// # What it guarantees
//
//   - At most one holder at a time per name, as far as the backend's
//     clock and atomicity go: a lease ends on the backend's clock (the
//     database's, Redis's), never on the application server's.
//   - The holder's view is conservative: the lease is counted from just
//     before the call that confirmed it was sent, so Done closes no later
//     than the backend's lease ends (up to the clocks' drift over one
//     TTL), even if a renewal hangs. Lease.Err and the Err of Context's
//     contexts check the clock, so work that checks them before its
//     effect does not go on past the lease when the process is starved of
//     CPU and its timers run late, or the machine was suspended (the time
//     passed is the larger of the monotonic clock's, which stands still
//     during a suspend on Linux, and the wall clock's; a step of the wall
//     clock forward ends a lease early, never late).
//   - A fencing token strictly increasing per lock name, across releases,
//     expiries and takeovers, returned with every lease (Lease.Fence).
//
// # What it does not guarantee
//
// A lease can end while its holder is still working: a pause (garbage
// collection, a suspended VM, a slow disk) longer than the remaining
// lease goes unnoticed until the holder looks again, and another owner
// may have acquired the lock meanwhile. No lock prevents that. What makes
// it safe is the fence: the resource the lock protects must refuse a
// write whose fence is lower than one it has accepted,
//
//	UPDATE resource SET v = ?, last_fence = ? WHERE id = ? AND last_fence < ?
//
// (0 rows: a newer holder wrote; stop). A lock alone does not protect a
// resource that does not check the fence.
//
// The backends differ in what their fence survives. sqlstore's
// (PostgreSQL, MySQL/MariaDB, SQLite) keeps a row per name, with the fence
// and the lease on the database's clock, in the database the resource
// likely lives in: a lock for correctness. redisstore's keeps the fence
// in a counter key of a single Redis node: a failover to a replica that
// had not received the last INCR, or an eviction of the key, can hand out
// a fence again. Use Redis locks for efficiency (avoiding duplicate work),
// not to protect correctness. MemoryBackend serves one process.
//
// Each backend keeps one small record per name ever acquired (the fence
// must outlive the lease), so lock names should come from a bounded set.
//
// # Shapes
//
// New(b Backend, cfg *Config) (*Locker, error): a nil cfg means the
// defaults, and cfg is copied. *Locker is an [Acquirer]; TryAcquire and
// Acquire return a [Lease], an interface, so that code taking a lock can
// be tested with fakes of both (only a Locker makes real leases). A
// Backend's tests run the shared suite locktest.Run. Errors are sentinels
// matched with errors.Is (ErrHeld, ErrNotHeld, ErrLost, ErrMaxHold,
// ErrReleased, ErrInvalidName), wrapped with the lock's name.
//
// # Advisory locks
//
// PGAdvisoryXactLock and PGTryAdvisoryXactLock take PostgreSQL's
// transaction-level advisory locks (PGAdvisoryKey maps a name to a key),
// and MySQLGetLock and MySQLTryGetLock MySQL's GET_LOCK on a session.
// They have one shape: (ctx, the tx or conn, name); ctx bounds the wait,
// the Try variants do not wait and answer ErrHeld, a session's lock comes
// with its release. They last as long as a transaction or a session, not
// a lease, and have no fence: they suit work that happens inside that
// transaction or session.
//
// # Writing a backend
//
// A Backend is three atomic operations; the conformance suite
// locktest.Run pins their contract.
package lock
