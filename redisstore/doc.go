// Package redisstore is an [idem.Store] on Redis through go-redis v9: a
// single server, a Sentinel-managed primary, or a Redis Cluster.
//
//	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	store, err := redisstore.New(client, nil)
//	guard, err := idem.NewGuard(store, nil)
//
// # Shapes
//
// Every constructor is NewX(client, cfg *XConfig) (*X, error): New
// (*Config), NewTokenStore (*TokenConfig), NewLockBackend (*LockConfig),
// NewInboxStore (*InboxConfig). A nil cfg means the defaults (the
// DefaultPrefix, …); cfg is copied; an invalid field is refused with an
// error naming it. Nothing is sent to the server, except New's read of
// the eviction policy.
//
// # Records and keys
//
// A record is one hash named
//
//	PREFIX:{B64(scope).B64(key)}
//
// where PREFIX is [Config].Prefix ("idem") and B64 is unpadded base64url
// (RFC 4648 §5). The base64url alphabet holds neither '.' nor '}', so a
// name decodes to exactly one (scope, key) — ("x:y", "z") and ("x", "y:z")
// never meet, whatever braces or separators they contain — and the text
// between the braces is a Redis Cluster hash tag: a record, and any key
// ever added beside it, lives in one slot. Prefixes may not hold braces, so
// two stores with different prefixes share no key.
//
// The hash's fields are status, fp, owner, fence, lease_until, retention,
// created_at, completed_at, expires_at and, once completed, code, header
// (a length-prefixed binary encoding), body (the raw bytes) and omitted.
// Times are unix milliseconds on the server's clock; durations are
// milliseconds, rounded up, so no lease or retention is shorter than asked.
//
// # Guarantees
//
//   - Each operation is one round trip. Acquire, Complete, Extend and
//     Release are each one Lua script (acquire.lua, complete.lua, …,
//     embedded in the package), so each is atomic on the server: of any
//     number of concurrent Acquire calls on one key, from any number of
//     processes, exactly one is told Acquired. Get is one HMGET, Delete one
//     DEL, DeleteIf ([idem.ConditionalDeleter]: an operator's eviction of
//     the record read, matched on owner and fence) one script. Scripts run with EVALSHA; after NOSCRIPT (a restart, a failover,
//     SCRIPT FLUSH) the same call falls back to EVAL, which caches the
//     script again.
//   - Leases and expiry use the server's clock (TIME inside the scripts;
//     Redis 5 and later replicate a script's effects, so a script that
//     reads TIME may write), never the application's.
//   - Complete, Extend and Release succeed only while the record is
//     processing with the lease's owner and fence, even after the lease
//     ended if nobody took over; otherwise [idem.ErrLeaseLost]. One
//     exception makes a retried Complete safe: Complete with the owner and
//     fence that completed the record returns nil and changes nothing (the
//     first response stays), so a call whose reply was lost may be
//     repeated. After a takeover the old lease still gets
//     [idem.ErrLeaseLost].
//   - Responses round-trip byte for byte: bodies of any bytes (up to Redis'
//     512 MB string limit), header names and values of any bytes (invalid
//     UTF-8 and empty values included) with their order of values. Nil
//     and empty bodies and headers are the same and come back nil.
//   - Errors name the operation ("redisstore: acquire: …"); redis.Nil never
//     escapes; a call whose context ended returns the context's error.
//
// # TTL and the grace
//
// A processing record has no Redis TTL: a key with a TTL is evictable
// under the volatile-* maxmemory policies, and a live lease must never be
// evicted (see Memory and eviction). Complete gives the record its TTL,
// PEXPIREAT CompletedAt + retention + [Config].Grace, so Redis removes a
// completed record on its own. The grace (1 min by default) keeps an
// expired record visible for a while, as the [idem.Store] contract asks:
// Get still returns it, and an Acquire that replaces it continues its
// fence (old fence + 1). Once Redis has deleted it, or with a negative
// Grace (TTL exactly at ExpiresAt), the key starts again as a new record
// with fence 1, not reported as a takeover — as after Release or Delete.
// That never lets a stale lease act: a lease is owner and fence, and
// owners are random 128-bit tokens, so an old lease of fence 1 cannot
// match the new record of fence 1. Fences are therefore strictly
// increasing per key only while a record exists; do not hand them to
// other systems as a key-lifetime counter.
//
// A processing record whose process died (abandoned: nobody completes or
// releases it) therefore stays until its ExpiresAt, LeaseUntil +
// retention, has passed and then either an Acquire of its key replaces it
// (TookOver, fence + 1) or Sweep removes it. Nothing removes it by itself:
// where processes may die in flight and keys are never retried, call
// Sweep now and then, or abandoned records accumulate. Processing records
// written by earlier versions of the store, which had a TTL, lose it at
// their next Extend or takeover.
//
// # Memory and eviction
//
// When a Redis server reaches maxmemory, its maxmemory-policy decides
// which keys it deletes. The store needs one that never deletes a live
// lease, or a duplicate request runs its effect again:
//
//   - noeviction (Redis' default): nothing is evicted; once memory is full,
//     writes fail, so Acquire returns an error and the guard fails closed.
//     This is the only policy under which every guarantee holds.
//   - volatile-* (volatile-lru, volatile-lfu, volatile-random,
//     volatile-ttl; the default of several managed services): only keys
//     with a TTL are evicted, so processing records never are. Completed
//     records have a TTL and may be evicted before their retention ends;
//     a retry of an evicted one then runs again, as after its retention.
//     Once nothing is evictable, writes fail as under noeviction.
//   - allkeys-*: any key may be evicted, a live lease included. [New]
//     reads the policy with one CONFIG GET (per master of a cluster, per
//     shard of a ring) and refuses such a server
//     unless [Config].AllowAllKeysEviction accepts the risk (it then logs
//     a warning). Where CONFIG is disabled or denied (many managed
//     services), New cannot read the policy: it logs that at info level
//     and goes on, and checking the policy is the operator's task. New
//     reads it once, from the masters of the moment: give every node of a
//     cluster (replicas, which a failover promotes, included) the same
//     policy, and do not change it later.
//
// The store writes one key per record and nothing else (no index, no
// marker), so no other key of it can be evicted.
//
// # Sweep
//
// Sweep removes expired completed records before their TTL does, and is
// the only thing besides Acquire that removes abandoned processing
// records once their ExpiresAt has passed; it never removes a processing
// record whose lease is live. It SCANs the keys of the store's prefix
// (TYPE hash, COUNT 1000) on every master of a cluster (ForEachMaster) or
// shard of a ring (ForEachShard), concurrently; per SCAN batch it reads
// the three deciding fields of each key in one pipeline, and runs
// sweep.lua, which re-checks and deletes atomically, on the expired ones
// in another. A full Sweep thus costs O(keys on the server) SCAN work and
// about two round trips per thousand keys of the prefix, whatever the
// number of expired records: call it rarely (every few minutes to hours,
// depending on how many executions die in flight) on a large keyspace.
// Sweep needs Redis 6 or later (SCAN … TYPE); the other operations need
// Redis 5.
//
// # Tokens
//
// [TokenStore] keeps the pre-issued submit tokens of package
// [github.com/idemkit/idem/token]: one hash per token at
// PREFIX:token:{SCOPETAG}:DIGEST (DIGEST the SHA-256 of the ID, which is
// never stored; SCOPETAG a 64-bit hash of the scope), with the scope and,
// once spent, the time of use, the result and the request's fingerprint;
// and per scope a sorted set of its unused tokens by expiry,
// PREFIX:tokens:{SCOPETAG}:SCOPE (SCOPE in unpadded base64url: two
// scopes whose tags meet share a slot, never a set), in the same Cluster
// slot. Insert
// (token_insert.lua) writes the hash and its expiry, the server's now +
// TTL, and adds it to the set, in one script; Consume (token_consume.lua)
// checks the scope and that the token is unused, marks it used with its
// result and fingerprint, moves the key's expiry to now + Keep if that is
// later and takes it out of the set, in one script, so of concurrent
// Consumes exactly one is told nil; Trim (token_trim.lua) drops the set's
// expired members and deletes the tokens beyond the newest it keeps.
// Redis deletes a token when its expiry comes, used or not: there is
// nothing to sweep. A lost token (restart, failover, eviction) answers
// token.ErrInvalid, never a second first use. Tokens written by versions
// before the scope's hash tag (PREFIX:token:DIGEST) are not found after
// an upgrade: open forms must be reloaded.
// Token keys never match a Store's records (PREFIX:{…}), so one prefix
// may serve both.
//
// # What it does not guarantee
//
//   - Durability is the server's. Without persistence (RDB snapshots or
//     AOF with appendfsync always) a restart loses records: a completed
//     key then runs its effect again on the next retry, and an in-flight
//     one may run twice. Use sqlstore (or tieredstore) when a duplicate
//     effect is unacceptable.
//   - Replication is asynchronous. A failover (Sentinel or Cluster) can
//     lose the last writes the old primary acknowledged: an Acquire or a
//     Complete that succeeded may be gone on the new primary, and a retry
//     then runs the effect again. [Config].WaitReplicas closes this for
//     the writes it covers (see Replicas and failover).
//   - It cannot complete inside an SQL transaction: it does not implement
//     [idem.TxCompleter], so [idem.Execution.CompleteTx] answers
//     [idem.ErrTxUnsupported].
//   - Get is a plain read: on a cluster client configured to read from
//     replicas (ReadOnly, RouteByLatency, RouteRandomly) it may return a
//     stale record. Acquire and the other scripts always run on the
//     primary.
//   - A call's context bounds it only as far as go-redis lets it: set the
//     client's ContextTimeoutEnabled, or go-redis ignores the deadline
//     (the guard's StoreTimeout included) and a server that stops
//     answering holds each call for the client's ReadTimeout and retries.
//   - Keys are tagged for a cluster slot, but a record moved by resharding
//     while Sweep scans a node is skipped by that Sweep (MOVED), not lost.
//
// # Replicas and failover
//
// With [Config].WaitReplicas set to n, Acquire, Extend and Complete send
// WAIT n after their script, on the same connection and in the same
// pipeline, and succeed only once n replicas have acknowledged the
// write (within [Config].WaitTimeout, 1 s by default); otherwise they
// fail with an error wrapping [ErrNotReplicated]. A failover that
// promotes one of those replicas keeps the record: Sentinel promotes the
// replica with the greatest replication offset, so with n = 1 an
// acknowledged write survives the loss of the primary as long as the
// replica that has it is reachable; n = the number of replicas makes
// that hold whichever replica is promoted. The cost: each write waits
// for a replica's acknowledgement (one round trip more, inside the same
// pipeline), and while fewer than n replicas are connected — just after
// a failover, until the old primary comes back as a replica — every
// Acquire fails (idemhttp answers 503) and completions are retried.
//
//	client := redis.NewFailoverClient(&redis.FailoverOptions{
//		MasterName: "mymaster", SentinelAddrs: sentinels, ContextTimeoutEnabled: true,
//	})
//	store, err := redisstore.New(client, &redisstore.Config{WaitReplicas: 2}) // both replicas
//
// WAIT reports; it does not undo. A write whose WAIT fell short stays on
// the primary and may still reach a replica, or be lost. The store
// releases an Acquire whose WAIT fell short (the guard answers 503, no
// effect ran); a Complete that fell short leaves the record completed on
// the primary and the execution open, and a retried Complete with the
// same lease answers nil at once on a primary that has it and waits
// again. The guard's adapters (Guard.Do, idemhttp, idemgrpc) retry a
// completion that fails so for up to idem.GuardConfig.CompleteRetry (10 s
// by default) before answering; make it outlast a failover. The
// renewals wait too, so a lease must
// outlast a failover (the Sentinels' down-after-milliseconds plus the
// election, a few seconds): a guard that cannot confirm its lease for a
// whole lease gives the key up. WaitReplicas needs a *redis.Client (a
// single server, or redis.NewFailoverClient) or a *redis.ClusterClient.
//
// redis.NewFailoverClient asks one Sentinel (the first to answer) where
// the primary is, and follows that Sentinel's +switch-master messages; it
// does not compare Sentinels. A Sentinel that names a replica sends every
// connection there: each script fails READONLY (go-redis closes the
// connection, asks the same Sentinel and dials the same replica again)
// and the guard answers 503 for as long as that Sentinel is wrong. No
// FailoverOptions field avoids it: MaxRetries repeats the same answer,
// ReplicaOnly and RouteByLatency read from replicas, which a store
// cannot use. Redis 7's Sentinel can be left so for good: when the new
// primary dies while the Sentinel that promoted it is still in that
// failover (reconfiguring the replicas, up to failover-timeout), the
// others fail it over at a higher epoch, and that Sentinel, at the end
// of its failover, switches to the server it promoted at that same
// epoch and ignores the others from then on (SENTINEL RESET does not
// clear it). Watch that every Sentinel's SENTINEL
// get-master-addr-by-name agrees.
//
// Tested against Redis 7.
//
// # Locks
//
// [LockBackend] is a [lock.Backend] on Redis, an efficiency lock (its
// fence is a counter on one node; see its documentation).
//
// # Inbox
//
// [InboxStore] is an [inbox.Store] for Inbox.Handle (effects outside a
// database): one hash per consume record at PREFIX:inbox:LEN:GROUP:ID,
// one Lua script per operation on the server's clock. Succeeded and dead
// records expire after InboxConfig.Retention; processing and failed ones
// carry no TTL, and InboxStore.Sweep removes them once they are old (a
// failed message whose redelivery never came, a processing one whose
// consumer died): call it now and then. A record the server loses (restart without persistence,
// failover, allkeys-* eviction) lets a later duplicate run its handler
// again. It does not implement inbox.TxStore.
package redisstore
