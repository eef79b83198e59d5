// Package idem makes the effects of a backend happen once, however often a
// request, a callback or a message arrives.
//
// The package holds the vocabulary every other package of the module speaks:
// a [Record] keyed by (scope, key), the [Store] contract that keeps records,
// and the [Guard], which runs one execution under a lease:
//
//	acquire → renew the lease while the work runs (the watchdog) → complete with the fence, or release
//
// # Guarantees
//
//   - Of any number of concurrent Acquire calls on one (scope, key), exactly
//     one is told [Acquired]; the others see [InFlight], [Completed] or
//     [Mismatch].
//   - Every acquisition or takeover of a record increments its fence. A
//     completion, extension or release must present the owner token and the
//     fence it was given, so an execution whose lease was taken over can never
//     overwrite the winner ([ErrLeaseLost]).
//   - Times that decide leases and expiry come from the store's clock, never
//     from the application server's.
//   - A completed record is kept for its retention (default 24 h) and then
//     replaced by the next Acquire or removed by Sweep.
//
// # What idem does not guarantee
//
//   - An effect outside the store's database cannot commit atomically with the
//     record. Between the effect and [Execution.Complete] a crash leaves a
//     processing record whose lease runs out; the retry then runs the work
//     again. Put the effect and the completion in one transaction with
//     [Execution.CompleteTx] (sqlstore), or make the effect itself idempotent.
//   - Scopes are the caller's identity. Two callers in one scope share a key
//     space: derive the scope from authenticated identity, never from input
//     the caller chooses freely.
//
// Package idem imports the standard library only.
package idem
