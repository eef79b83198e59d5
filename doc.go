// Package idem makes the effects of a backend happen once, however often a
// request, a callback or a message arrives.
//
// The package holds the vocabulary every other package of the module speaks:
// a [Record] keyed by (scope, key), the [Store] contract that keeps records,
// and the [Guard], which runs one execution under a lease:
//
//	acquire → renew the lease while the work runs (the watchdog) → complete with the fence, or release
//
// [Guard.Do] runs a function once per key and stores the Response it
// returns; [Wrap] does so for any typed function (func(ctx, I) (O,
// error)), storing its result with a [Codec] and its [DefiniteError]s.
//
// # Guarantees
//
//   - Of any number of concurrent Acquire calls on one (scope, key), exactly
//     one is told [Acquired]; the others see [InFlight], [Completed] or
//     [Mismatch].
//   - A record's fence is 1 when the record is created and grows by one on
//     every takeover (and when Acquire replaces the record after it
//     expired). A completion, extension or release must present the owner
//     token and the fence it was given, so an execution whose lease was taken
//     over can never overwrite the winner ([ErrLeaseLost]).
//   - While the work runs, its context ([Execution.Context]) is cancelled
//     with cause [ErrLeaseLost] no later than the end of the lease the store
//     last confirmed, as the guard estimates it on its own clock, even while
//     a renewal still waits for an answer. (The watchdog pauses while a
//     completion is being stored, and while the transaction of a successful
//     [Execution.CompleteTx] is open: that transaction holds the record.)
//   - Times that decide leases and expiry come from the store's clock, never
//     from the application server's.
//   - A completed record is kept for its retention (default 24 h) and then
//     replaced by the next Acquire or removed by Sweep.
//
// # What idem does not guarantee
//
//   - The fence orders the executions of one record, from its creation until
//     it is released, deleted, swept or dropped by the store's own expiry
//     (a Redis TTL); the next record of the same (scope, key) starts at
//     fence 1 again. So it refuses stale completions, but it is not a
//     fencing token for systems downstream: two executions of one key, one
//     before and one after a release, can carry the same fence. Fence a
//     downstream system with a token that strictly increases per resource
//     and survives release and expiry (the lock package is planned to offer
//     those).
//   - An effect outside the store's database cannot commit atomically with the
//     record. Between the effect and [Execution.Complete] a crash leaves a
//     processing record whose lease runs out; the retry then runs the work
//     again. So does a store that takes no write for longer than the lease
//     (a failover, or a Redis that cannot reach the replicas its WAIT asks
//     for): the execution can neither renew nor complete, its lease is
//     lost, and a retry takes the key over. Put the effect and the completion in one transaction with
//     [Execution.CompleteTx] (sqlstore), or make the effect itself idempotent:
//     a call to a service that takes an idempotency key (a payment
//     provider) carries a key derived from the lease, [Lease.DeriveKey],
//     the same in every execution of the request.
//   - Scopes are the caller's identity. Two callers in one scope share a key
//     space: derive the scope from authenticated identity, never from input
//     the caller chooses freely.
//
// # Logs
//
// idem, idemhttp, idemgrpc, sqlstore, redisstore, tieredstore, lock,
// natsjs, rabbitmq and outbox log with log/slog, under these attribute
// names (constants Log* of this package):
//
//	idem.key_hash  HashKey of the record's scope and key: one key's lines, without the key
//	               (a message: HashKey("", its ID); a lock: HashKey("lock", its name))
//	idem.scope     the scope, only when the operator opts in (LogKeys in the configs)
//	idem.key       the key, only when the operator opts in
//	idem.route     the route pattern (HTTP) or full method (gRPC)
//	idem.outcome   what the request got: an Outcome* constant
//	idem.store     the store's name
//	idem.fence     the lease's fence
//	idem.status    the HTTP status of a response
//	err            the error
//
// Keys, scopes, message IDs and lock names may identify users or carry
// secrets: by default a line carries idem.key_hash only ([LogKey]); only
// idemhttp and idemgrpc (and the Guard) log the scope and key themselves,
// when their LogKeys is set.
//
// # Observers
//
// An [Observer] set in [GuardConfig] (or in idemhttp's and idemgrpc's
// Config) receives every decision and store call; [ObserveStore] reports
// the calls of any store. The idemprom module turns them into Prometheus
// metrics; with no Observer, nothing is reported and nothing is paid but a
// comparison.
//
// Package idem imports the standard library only.
package idem
