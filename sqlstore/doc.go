// Package sqlstore is an [idem.Store] and [idem.TxCompleter] over
// database/sql. It speaks [SQLite] today; PostgreSQL and MySQL/MariaDB
// dialects are values of [Dialect] still to come, each with its own
// statements (queries/NAME.sql) and migrations (migrations/NAME/), embedded
// in the package.
//
//	db, err := sqlstore.OpenSQLite(ctx, "data/idem.db")
//	store, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
//	err = store.Migrate(ctx) // at start-up; idempotent
//	guard, err := idem.NewGuard(store, nil)
//
// # Schema
//
// Migrate creates idem_records, one row per (scope, idempotency_key) with
// the fingerprint, status, owner, fence, lease end, retention, the response
// (status, headers as JSON, body as a BLOB, the body-omitted marker) and
// created_at, completed_at and expires_at, plus an index on expires_at for
// Sweep. Times are INTEGER unix milliseconds; durations are milliseconds.
// Applied migrations are recorded, with their version, in
// idem_schema_migrations.
//
// # Guarantees
//
//   - Every time that decides a lease or an expiry is the database's: each
//     statement reads "now" itself (on SQLite,
//     CAST(unixepoch('subsec')*1000 AS INTEGER), constant within the
//     statement), never the Go process's clock. Times have millisecond
//     precision; leases, TTLs and retentions are rounded up to whole
//     milliseconds, so none is shorter than asked.
//   - Acquire first reads the record: a key that is completed, in flight
//     or bound to another fingerprint is answered by that one read (such a
//     record changes only when its lease or retention ends), so replays
//     and duplicates never take the write lock. Otherwise it runs one write
//     transaction whose first statement is an upsert (INSERT … ON CONFLICT
//     DO UPDATE … WHERE the record is expired or its lease ended …
//     RETURNING): a new, replaced or taken-over key costs that statement; if
//     another caller took the key between the read and the write, a second
//     read under the same lock reports it. Of any number of concurrent
//     Acquire calls on one key, in one process or several, exactly one is
//     told Acquired.
//   - Complete, Extend, Release, Delete and Sweep are one statement each.
//     Complete, Extend and Release match on status = processing, owner and
//     fence; when they match nothing, a second read says why, and the error
//     wraps [idem.ErrLeaseLost]. A lease that ran out but was not taken over
//     still completes.
//   - [Store.CompleteTx] runs Complete's statement in the caller's
//     transaction: the effect and the stored response commit together or
//     not at all.
//   - Sweep deletes, in one statement, at most limit records whose
//     expires_at has passed, found through the expires_at index, and never
//     a processing record whose lease is live.
//   - Errors say which operation failed ("sqlstore: acquire: …").
//     [idem.ErrNotFound] and [idem.ErrLeaseLost] are the only sentinels a
//     caller needs; sql.ErrNoRows never escapes; a call whose context ended
//     fails with an error that matches the context's error; driver errors
//     are wrapped (errors.As finds the driver's error type), with a hint to
//     run Migrate when the table is missing.
//   - Responses round-trip byte for byte (bodies of any bytes and size up
//     to the database's limit, 1 GB on SQLite); so do fingerprints. Nil and
//     empty bodies and headers are the same and come back nil.
//
// # SQLite: settings, and how they were chosen
//
// [OpenSQLite] opens the file in WAL mode with busy_timeout=10000,
// _txlock=immediate and synchronous=FULL, and allows the pool a single
// connection (SetMaxOpenConns(1)).
//
// A single connection makes the Go pool the queue of the process's
// writers. SQLite's own queue, busy_timeout, is a retry loop that sleeps
// (1, 2, 5 … 100 ms) and hands the lock to whoever retries at the right
// moment, so with several connections in one process some callers wait
// seconds while others pass, and under enough load one waits past the
// timeout and fails with "database is locked". BenchmarkContention measured
// this on the project's 2-core machines (WAL, synchronous=FULL; each
// operation is Acquire then Complete on a new key, two commits; three runs
// each; max is the slowest single operation):
//
//	                    32 callers                    512 callers
//	               ops/s  p99      max           ops/s        p99         max
//	1 connection   3,000  34-43ms  70-120ms      3,000        0.54-0.56s  0.9-1.1s
//	8 connections  3,000  26-39ms  2.6-3.6s      3,000        0.52-0.56s  2.9-3.5s
//	unlimited      3,500  0.8ms    3.1-3.4s      1,000-2,100  2.0-2.7s    3.0-3.4s
//
// With a business transaction (Acquire, then BEGIN, INSERT, CompleteTx,
// COMMIT) the picture is the same: 2,500-2,700 ops/s, and a max of
// 70-110 ms (32 callers) and 1.0-1.3 s (512) on one connection against
// 2.6-3.5 s on 8 or unlimited connections. Throughput is bound by the one
// fsync of each commit whatever the pool, since SQLite runs one writer at a
// time. The tail is not: pools of several connections leave some callers
// waiting 3 s already at 32 callers, and in an exploratory run at 512
// callers on a loaded machine the 8-connection pool failed one call in
// 9,000 with "database is locked" after a 19 s wait. The single connection
// never returned that error in any run. Replays (Acquire on a completed
// key) run at about 33,000/s in every configuration.
//
// WAL lets other processes read while one writes, and commits with one
// fsync. busy_timeout=10000 is for other processes sharing the file (the
// multi-process test runs 4): their writers queue on the file lock, and a
// transaction held longer than 10 s by one process makes the others' writes
// fail. _txlock=immediate makes every transaction begun with db.BeginTx
// take the write lock at BEGIN, so none fails half way when it first
// writes after reading (a deferred transaction that reads and then writes
// fails at once with SQLITE_BUSY if another connection committed in
// between). The store's own transactions do not depend on it: Acquire's
// first statement is its write, and Migrate runs BEGIN IMMEDIATE itself.
//
// synchronous=FULL fsyncs the WAL at every commit, so a completed record
// survives a process crash, an OS crash and a power cut. synchronous=NORMAL
// would survive a process crash only, and is about 3× faster (about 10,000
// Acquire+Complete/s at 32 callers): a lost completion means the work runs
// again on retry, which for an effect outside the database is a second
// effect. Open the database yourself with _synchronous=NORMAL (and the
// other settings above) if that trade is right for you.
//
// # What this package does not guarantee
//
//   - With one connection, a goroutine that holds a transaction and then
//     calls db, or a method of the Store other than CompleteTx, waits for
//     the connection its own transaction holds, until its context ends.
//     Inside a transaction, use the transaction only.
//   - While a transaction that called CompleteTx is open it holds the
//     database's write lock (and, under OpenSQLite, its only connection):
//     every other write waits for it. Keep such transactions short.
//   - SQLite's clock is the clock of the host that runs the statement. The
//     processes sharing a SQLite file share a host, so they share a clock;
//     a step of that clock moves every lease. Do not put a SQLite database
//     on a network file system: its locks are not reliable there.
//   - AcquireResult.TookOver is derived from created_at, which a takeover
//     keeps and a new record sets to now; a backwards step of the clock
//     within one millisecond of a record's creation could misreport it. It
//     is informational: the fence is what protects the record.
//   - A database migrated by a newer version of this package is used as
//     it is; Migrate does not downgrade.
package sqlstore
