// Package tieredstore is an [idem.Store] with Redis in front of a truth
// store (sqlstore in practice). The truth decides every acquisition and
// completion; Redis answers only what is safe to answer without it:
// replays of completed keys, duplicates of keys in flight, and requests
// that reuse a key with another fingerprint. When Redis fails or hangs,
// the store goes on with the truth alone: no error, no duplicate effect.
//
//	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
//	truth, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
//	store, err := tieredstore.New(client, truth, nil)
//	guard, err := idem.NewGuard(store, nil)
//
// # Entries
//
// A key has at most one cache entry, one Redis string named
//
//	PREFIX:{B64(scope).B64(key)}
//
// (PREFIX is [Config].Prefix, "idem-cache"; B64 is unpadded base64url, so
// a name decodes to exactly one (scope, key), and the braces make it a
// Redis Cluster hash tag). Its value is the whole record in a small
// versioned binary encoding; an entry that does not decode is ignored. An
// entry is one of:
//
//   - in flight: the processing record, written when the truth answers
//     Acquired, rewritten by Extend, deleted by Release (whatever the truth
//     answered) and CompleteTx, replaced by Complete (deleted when the
//     truth answered an error: it may have completed before its reply was
//     lost). Its TTL is the lease, counted from before the
//     truth call, so it ends no later than the lease does in the truth.
//     Only the lease's holder writes it: an InFlight answer of the truth
//     (someone else's lease, perhaps in a process whose Redis write failed)
//     is never cached.
//   - completed: the completed record, written by Complete with TTL =
//     retention counted from before the truth call, and no later than the
//     record's ExpiresAt by the application's clock (a Complete retried
//     after its reply was lost finds the record its first call completed,
//     which expires retention after that call), or by an Acquire or
//     Get that found a live completed record in the truth, with TTL =
//     ExpiresAt − now (the application's clock), capped at the record's
//     retention.
//
// Cached records are the truth's, field for field (times included),
// without reading the truth again: an Acquired result carries the record
// the truth wrote ([idem.AcquireResult]), and a truth that implements
// [RecordCompleter] (sqlstore does) returns the record it completed. A
// truth that does not is read back (one Get) after Complete, and after
// Extend in every case; if that read fails, or shows a record that is no
// longer the lease's, the entry is deleted instead.
//
// Acquire reads the entry first (one GET). A completed entry answers
// Completed, or Mismatch for another fingerprint; an in-flight entry
// answers InFlight, or Mismatch. An entry is used only while its TTL runs
// on Redis' clock and, in addition, while the application's clock is
// before its ExpiresAt (completed) or LeaseUntil (in flight): a clock
// skew can only make the store skip an entry, never stretch one. Anything
// else (no entry, an unusable one, Redis unreachable) goes to the truth.
//
// # Why it cannot run an effect twice
//
// Every Acquired comes from the truth; Redis can only turn a request
// away (InFlight, Completed, Mismatch), never let one run. The worst a
// stale entry does is turn away a request the truth would have let run:
//
//   - A stale in-flight entry answers 409 to retries until its TTL. It
//     is left behind when a Redis write of Release, Complete or Extend
//     (Extend's delete of the entry of a lease it shortens included)
//     failed, timed out or was skipped while the circuit was open; when a
//     write that timed out landed late; or when an Extend still running,
//     its context live, read the processing record back just before its
//     lease was completed or released and wrote the entry just after (the
//     Guard cancels its renewal before it completes, and Extend then
//     deletes the entry it wrote). In-flight entries live at most
//     Config.MarkerTTL (1 s by default; never longer than the lease),
//     after which duplicates of a still-running execution are answered by
//     the truth.
//   - A stale completed entry exists only after a Delete or DeleteIf
//     (operator eviction) whose Redis delete failed, or raced a Get, an
//     Acquire or a Complete (of a lease that ended but was not taken over)
//     that read or wrote the record just before the delete and cached it
//     just after: the deleted response is replayed until the entry's TTL.
//     A Redis delete that fails (tried even while the circuit is open) is
//     not silent: Delete and DeleteIf return ErrCacheEntryKept, and a
//     second Delete once Redis answers removes the entry.
//   - A completed entry never outlives the truth's ExpiresAt: its TTL is
//     counted from before the truth computed ExpiresAt, and entries filled
//     from a record found in the truth are also checked against the
//     application's clock. (If the application's clock is behind the
//     database's, such an entry may answer a replay slightly past the
//     retention: a replay the truth would have run again.)
//
// # Redis outage
//
// Each Redis call is bounded by [Config].Timeout (50 ms). With the
// client's ContextTimeoutEnabled set (recommended), the call runs on the
// caller's goroutine with that deadline, which the client honours on the
// socket. Without it, the call runs on a goroutine of its own that the
// store stops waiting for at the timeout (the client's goroutine finishes
// at its own ReadTimeout); the hand-off costs a goroutine wake-up per
// call, which made a cache hit 1.6× a PING instead of 1.05× on the
// project's machine (docs/benchmarks.md). A failed or timed-out
// call opens a circuit for [Config].Cooldown (1 s): Redis is then skipped
// altogether, and operations cost what the truth costs. When the cooldown
// ends, one call probes Redis; success closes the circuit, failure opens
// it for another cooldown. One warning is logged when the circuit opens
// and one message when Redis answers again. Stats ([Store]) counts hits,
// misses, errors, trips and skipped calls.
//
// During an outage nothing is cached, so after it replays and duplicates
// go to the truth until normal traffic has filled the entries again (the
// first replay of a completed key caches it).
//
// # Guarantees
//
//   - Everything the truth guarantees about acquisitions, leases, fences,
//     completions and CompleteTx: they are the truth's.
//   - A replay, a duplicate in flight or a mismatch whose entry is cached
//     costs one Redis GET and no truth call.
//   - No operation fails because of Redis; its errors are only logged and
//     counted.
//   - The Store that [New] returns implements [idem.TxCompleter] exactly
//     when the truth does, decided once by New: its CompleteTx is the
//     truth's, and deletes the in-flight entry at once; the completed record
//     is cached by the next Get (the Guard's Committed calls one) or Acquire
//     after the commit. Over a truth without CompleteTx (memstore,
//     redisstore) it has none, and [idem.Execution.CompleteTx] answers
//     [idem.ErrTxUnsupported] without calling the store.
//   - The Store holds no goroutine, timer or connection between calls, so
//     it has no Close; the caller closes the Redis client and the truth.
//     (Without ContextTimeoutEnabled, the goroutine of a Redis call that
//     ran past the timeout lives on until the client's own timeouts end
//     it.)
//   - Get, Delete, DeleteIf and Sweep are the truth's. Get caches a live
//     completed record. Delete removes the cache entry after the truth's
//     delete (also when the truth had no record), and so does DeleteIf
//     (which the Store has exactly when its truth is an
//     [idem.ConditionalDeleter]) when the truth deleted the record or had
//     none. Sweep leaves cache entries to their TTL.
//
// # Performance
//
// BenchmarkReplay and BenchmarkReplayUnderWrites (a 2-core machine, Redis
// and SQLite on loopback and local disk; medians of 5 runs):
//
//	replay (Acquire on a completed key)       cache      truth (SQLite)
//	one caller                                49 µs      14 µs
//	32 callers at once                        12 µs      13 µs
//	one caller, 4 writers busy on the truth   30 µs     434 µs
//	Redis PING (the floor of a round trip)    54 µs
//
// # What it does not guarantee
//
//   - Redis does not take load off writes: Acquire of a new key costs a
//     Redis read, the truth's write and a Redis write; Complete the truth's
//     write and a Redis write; Extend the truth's write, a truth read and
//     a Redis write. With 64 clients on a PostgreSQL truth this is about
//     0.80-0.84× the throughput of the truth alone (docs/benchmarks.md).
//   - On SQLite in the same process, a replay read from the truth is about
//     as fast as a Redis round trip (see BenchmarkReplay): the cache pays
//     off with a database across the network, or when the database is busy
//     with writes (sqlite.Open's single connection serves reads and writes
//     in turn).
//   - Entries hold whole responses; large bodies take Redis memory for
//     their retention.
//   - Redis keys of the prefix are written by this package only; sharing a
//     prefix with a redisstore or another application is not supported.
package tieredstore
