// Package memstore is an in-process [idem.Store]: one mutex over a map.
//
// It keeps the whole [idem.Store] contract and passes the storetest suite,
// so it serves tests, examples and services that run as a single instance.
//
// # What it guarantees
//
//   - Every operation is atomic: one mutex guards every record, so of any
//     number of concurrent Acquire calls on one (scope, key) exactly one is
//     told [idem.Acquired].
//   - Leases, fences, retention and Sweep behave as documented on
//     [idem.Store]; times come from the store's clock ([Config].Now).
//     They are compared as [time.Time] compares them: on the monotonic
//     clock when the clock's times carry a reading of it (time.Now's
//     do), so a step of the system's wall clock neither ends a live
//     lease nor expires a completed record early.
//   - Complete called again with the lease that completed the record
//     returns nil and changes nothing: the first response stays. Any other
//     lease, one replaced by a takeover included, gets
//     [idem.ErrLeaseLost].
//   - Responses round-trip byte for byte: header names and values (invalid
//     UTF-8 and empty values included) and bodies.
//   - Stored responses are deep copies: neither the response given to
//     Complete nor a record returned by Get or Acquire shares memory with
//     what the store keeps (but for strings, which do not change).
//   - A record costs the garbage collector a few words however large its
//     response: the store keeps each record's fingerprint, owner and
//     encoded response in one string, so a store of a million completed
//     records does not slow every collection of the process down.
//   - Times in the records it returns are those of its clock, to the
//     nanosecond, without a monotonic reading and in the local location
//     (compare them with Equal, as those of the other stores).
//
// # What it does not guarantee
//
//   - It is one process's memory. Two instances of a service each have
//     their own store, so a request retried against the other instance runs
//     its effect again. Use sqlstore or redisstore for more than one
//     instance.
//   - Nothing survives a restart: every record, completed or processing, is
//     gone when the process ends.
//   - It cannot complete inside an SQL transaction: it does not implement
//     [idem.TxCompleter], so [idem.Execution.CompleteTx] answers
//     [idem.ErrTxUnsupported].
//   - It runs no background goroutine and holds nothing but memory, so it
//     has no Close. Expired records are replaced by the next Acquire on
//     their key; call Sweep now and then to free the memory of keys that
//     are never used again.
package memstore
