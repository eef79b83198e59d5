// Package sqlstore is an [idem.Store] and [idem.TxCompleter] over
// database/sql. It speaks three dialects, values of [Dialect]: [SQLite],
// [PostgreSQL] and [MySQL] (which covers MariaDB). Each has its own
// statements (queries/NAME.sql) and migrations (migrations/NAME/),
// embedded in the package.
//
//	db, err := sqlite.Open(ctx, "data/idem.db") // package github.com/idemkit/idem/sqlstore/sqlite
//	store, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
//	defer store.Close() // its prepared statements; db stays open
//	err = store.Migrate(ctx) // at start-up; idempotent
//	guard, err := idem.NewGuard(store, nil)
//
// For PostgreSQL and MySQL the caller opens the *sql.DB with the driver
// and keeps it in hand (pool size, TLS, credentials). This package
// imports no PostgreSQL driver; it imports github.com/go-sql-driver/mysql
// for its error type (*mysql.MySQLError, which it reads with errors.As),
// and so registers that driver as "mysql":
//
//	import _ "github.com/jackc/pgx/v5/stdlib"
//	db, err := sql.Open("pgx", "postgres://app@db/app")
//	store, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.PostgreSQL})
//
//	import _ "github.com/go-sql-driver/mysql"
//	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
//	store, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.MySQL})
//
// # Shapes
//
// Every constructor is NewX(db *sql.DB, cfg *XConfig) (*X, error): New,
// NewTokenStore, NewLockBackend and NewInboxStore take a *Config,
// NewOutboxStore an *OutboxConfig. The Dialect is required (a nil cfg, or
// one without it, is refused with an error naming Config.Dialect); cfg
// is copied. A Dialect is also a sqldialect.Dialect: pass sqlstore.PostgreSQL
// to fsm.TableConfig as it is. Errors are sentinels (ErrClosed, …)
// matched with errors.Is; [Retryable] classifies the database's
// serialisation failures and deadlocks.
//
// # Schema
//
// Migrate creates idem_records, one row per (scope, idempotency_key) with
// the fingerprint, status, owner, fence, lease end, retention, the response
// (status, headers as text, body as a BLOB, the body-omitted marker) and
// created_at, completed_at and expires_at, plus an index on expires_at for
// Sweep. Times are integer unix milliseconds; durations are milliseconds.
// Applied migrations are recorded, with their version, in
// idem_schema_migrations. Column types: SQLite INTEGER/TEXT/BLOB (STRICT);
// PostgreSQL bigint/text/bytea/integer/boolean; MySQL BIGINT, VARBINARY(255)
// for scope, key and fingerprint (compared byte for byte: utf8mb4_bin is a
// PAD SPACE collation, under which "k" and "k " would be one key), LONGBLOB
// for the body, LONGTEXT for the headers. On SQLite and PostgreSQL a
// took_over column (SQLite migration 2, PostgreSQL migration 3) says
// whether a processing record's lease replaced another processing record
// (AcquireResult.TookOver). On PostgreSQL, migration 2 also creates the
// PL/pgSQL function idem_acquire_write (see "Acquire on PostgreSQL"), and
// migration 3 the table idem_renewals, the view idem_records_renewed and
// the function idem_sweep (see "Renewals on PostgreSQL"): the role that
// runs Migrate needs CREATE on the schema, as for the table, and the
// roles that use the store need EXECUTE on the functions, which
// PostgreSQL grants to PUBLIC by default, and SELECT, INSERT, UPDATE and
// DELETE on the tables and SELECT on the view. Everything is created in
// the first schema of the connection's search_path, and found there by
// the store's statements.
//
// # Guarantees
//
//   - Every time that decides a lease or an expiry is the database's: each
//     statement reads "now" itself, never the Go process's clock, and
//     "now" is constant within the statement. SQLite:
//     CAST(unixepoch('subsec')*1000 AS INTEGER). PostgreSQL:
//     statement_timestamp(), the time the statement began; not now(),
//     which inside the caller's transaction of CompleteTx is the time that
//     transaction began, possibly long before the completion; not
//     clock_timestamp(), which changes within a statement. MySQL:
//     UTC_TIMESTAMP(3) (like NOW(3), the time the statement began, not
//     SYSDATE's time of the call), turned into milliseconds by arithmetic
//     that involves no session time zone. Times have millisecond
//     precision; leases, TTLs and retentions are rounded up to whole
//     milliseconds, so none is shorter than asked. A statement that waits
//     for a row lock keeps the "now" of its start.
//   - Acquire: of any number of concurrent calls on one key, in one
//     process or several, exactly one is told Acquired (tested with 200
//     goroutines, and with 4 processes × 25 goroutines, on each dialect).
//     A replay, a duplicate in flight or a mismatch is answered by one
//     read that locks nothing (such a record changes only when its lease
//     or retention ends). What a new, replaced or taken-over key costs
//     depends on the dialect; see below.
//   - Complete, Extend, Release and Delete are one statement each; Sweep is one statement on SQLite and
//     MySQL and one call of idem_sweep in a READ COMMITTED transaction on
//     PostgreSQL. Complete, Release, Delete, Extend and Sweep run again
//     after a deadlock or a serialisation failure, at most 8 times;
//     CompleteTx, in the caller's transaction, does not. (On PostgreSQL
//     they run at READ COMMITTED whatever the sessions' default, so a
//     statement that waited for a concurrent change of its row reads the
//     row again rather than fail: TestPostgresDefaultIsolationWrites.) Complete, Extend and Release
//     match on status = processing, owner and fence; when they match
//     nothing, a second read says why, and the error wraps
//     [idem.ErrLeaseLost]. A lease that ran out but was not taken over
//     still completes.
//   - DeleteIf ([idem.ConditionalDeleter]: an operator's eviction of the
//     record read) is one DELETE that matches on owner and fence, run
//     again after a deadlock or a serialisation failure as Delete is. On
//     PostgreSQL the same statement reads the record it did not delete
//     (a CTE) and so tells [idem.ErrNotFound] from
//     [idem.ErrRecordChanged]; on MySQL and SQLite a DELETE that matched
//     nothing is followed by a read that says which.
//   - A completion is safe to retry: when Complete (or CompleteRecord)
//     matches nothing because the record is already completed under the
//     same owner and fence, the earlier completion committed (its reply
//     was lost, or MySQL's read back of CompleteRecord failed), and the
//     retry returns nil (CompleteRecord: the record as stored) without
//     writing; the stored response stays the first one. CompleteTx in
//     that case fails with an error matching [idem.ErrFinished]: its
//     transaction must roll back, not commit the effect a second time.
//     Only the failure path reads: a completion that matches costs what
//     it did.
//   - [Store.CompleteTx] runs Complete's statement in the caller's
//     transaction: the effect and the stored response commit together or
//     not at all. It locks the record's row (on SQLite, the database)
//     until the transaction ends: an Acquire that would take the record
//     over waits for it, and then sees the record completed (or, after a
//     rollback, still processing and takes it over). It succeeds under
//     every isolation level of each dialect while the execution holds the
//     record, however often the lease was renewed while the transaction
//     ran (TestCompleteTxIsolation: READ UNCOMMITTED, READ COMMITTED,
//     REPEATABLE READ and SERIALIZABLE on PostgreSQL and MySQL; SQLite is
//     always serializable), and fails with an error matching
//     [idem.ErrLeaseLost] after a takeover, under every level too.
//   - Sweep deletes at most limit records whose expires_at has passed,
//     found through the expires_at index, and never a processing record
//     whose lease is live (nor one whose owner's Extend succeeded: on
//     PostgreSQL TestExtendSweepRace pins that race).
//   - Migrate is idempotent and safe from several processes at once.
//   - The Store prepares each statement once on its *sql.DB (database/sql
//     then keeps it prepared on every connection that runs it).
//     [Store.Close] closes those statements, not the *sql.DB; after it,
//     every call fails with [ErrClosed] without reaching the database.
//   - Errors say which operation failed ("sqlstore: acquire: …").
//     [idem.ErrNotFound], [idem.ErrLeaseLost], [idem.ErrFinished]
//     (CompleteTx of a record the lease completed already) and
//     [ErrClosed] are the only sentinels a caller needs; sql.ErrNoRows
//     never escapes; a call whose context ended
//     fails with an error that matches the context's error; driver errors
//     are wrapped (errors.As finds *pgconn.PgError or *mysql.MySQLError),
//     with a hint to run Migrate when the table is missing.
//   - Responses round-trip byte for byte (bodies of any bytes and size up
//     to the database's limit: 1 GB on SQLite and PostgreSQL, LONGBLOB and
//     max_allowed_packet on MySQL); so do fingerprints, and header names
//     and values whatever bytes they hold. The header is kept as the JSON
//     object of its names and values when they are all valid UTF-8 (the
//     encoding of every earlier version of this package, so an older
//     build reads it), and otherwise, since JSON text cannot carry other
//     bytes, as "2:" and a JSON object of the base64 of each name and
//     value. Nil and empty bodies and headers are the same and come back
//     nil. During a rolling upgrade, a build older than this encoding
//     fails to read a record written in the "2:" form (with an error
//     naming a malformed header): upgrade every instance before a handler
//     sends header values that are not valid UTF-8.
//
// # Acquire on SQLite
//
// Acquire first reads the record (select_held). If Acquire may take it or
// there is none, it runs one write transaction whose first statement is
// an upsert (INSERT … ON CONFLICT DO UPDATE … WHERE the record is expired
// or its lease ended with the same fingerprint … RETURNING): a new,
// replaced or taken-over key costs the read and that statement; if
// another caller took the key between the read and the write, a second
// read under the same lock reports it. SQLite runs one writer at a time,
// so the upsert sees every committed row.
//
// # Acquire on PostgreSQL
//
// One statement, whatever the outcome. It reads the held record (live
// and completed, in flight, or another fingerprint) from the statement's
// snapshot, once (a CTE over idem_records_renewed, which applies
// renewals: see "Renewals on PostgreSQL"), and returns it; only if there
// is none it calls idem_acquire_write (a PL/pgSQL function that migration
// 2 creates, and migration 3 replaces): in migration 2's form, INSERT …
// ON CONFLICT (scope, idempotency_key) DO UPDATE … WHERE <expired, or
// lease ended with the same fingerprint> RETURNING.
// The statement returns the held record or the record it wrote, which is
// ours if and only if it carries the random owner Acquire passed. A
// replay or a duplicate thus costs one round trip that locks and writes
// nothing (no transaction id, no WAL flush), and never waits for another
// transaction, not even a CompleteTx holding the row (on MySQL too:
// TestDuplicateDuringCompleteTx, TestReadOnlyAnswers); a new, replaced
// or taken-over key costs one round trip and one commit.
//
// Why a function: the statement must not prepare an insert it will not
// run. A data-modifying WITH clause (the earlier form of this statement)
// costs every call the executor set-up of an INSERT … ON CONFLICT even
// when it inserts nothing; a function scan that is never executed costs
// about half as much (measured on PostgreSQL 15: a replay 10 µs above a
// plain primary-key read with the WITH clause, 5 µs with the function).
// A read first and the write second would make a replay exactly a
// primary-key read, at the price of a second round trip on every new
// key, the common case.
//
// Concurrency: the insert's arbiter index makes concurrent inserts of one
// key wait for each other; the DO UPDATE re-reads the latest version of
// the row it conflicts with, locks it, and applies its WHERE to that
// version, so of N callers one inserts and every other either takes over
// a record that may be taken (one at a time, each under the row lock) or
// finds the WHERE false. In that last case the row is one the
// statement's snapshot did not show (a concurrent insert committed after
// the statement began), and the function reads it in a new statement
// with a new snapshot (a volatile function's statements each take one
// under READ COMMITTED) and returns it: a conflict is never reported as
// "no record". If the row changed again in between (it was released, or
// its lease ended), the statement returns nothing and Acquire runs it
// again, at most 8 times. The store's statements run outside any
// transaction of the caller (autocommit); under the default READ
// COMMITTED that is all it needs. If the sessions'
// default_transaction_isolation is REPEATABLE READ or SERIALIZABLE (the
// Store asks once, on its first statement, and also switches when one
// of its statements run alone meets a serialization failure: a session
// whose default changed after it asked), each of them runs instead in
// a transaction of its own begun at READ COMMITTED (a BEGIN and a COMMIT
// more): they are written for READ COMMITTED, and SERIALIZABLE would
// make acquires of distinct keys fail each other with serialization
// failures (SQLSTATE 40001: the predicate lock on the idem_records_pkey
// page that an absent key's read takes conflicts with every insert into
// that page). A statement in the caller's transaction (CompleteTx) runs
// at the caller's level. A serialization failure or a deadlock that
// still happens is retried, with a pause. The transactions the dialect
// begins itself (Migrate, Sweep) are READ COMMITTED explicitly.
//
// A database that an older build migrated lacks the function: Acquire
// then fails with "has Store.Migrate run?", and Migrate adds it.
//
// Since migration 3, idem_acquire_write inserts a new record with ON
// CONFLICT DO NOTHING (the same cost), and on a conflict locks the
// record there (SELECT … FOR UPDATE), reads its lease as renewed (see
// below) in a later statement, and then replaces it (expired), takes it
// over (processing, same fingerprint, lease ended) or returns it (held
// by another owner). A replay or a duplicate whose statement's snapshot
// shows the record never calls it.
//
// Since migration 9, a conflict is first read without a lock (with its
// lease as renewed, in a statement of its own: a new snapshot, which
// shows the insert the call waited for), and a record another owner
// holds is returned at once; only a record Acquire may take is locked.
// This is the path of every request of a burst on a new key but the
// first (their snapshots predate the first one's insert): with the lock,
// they queued for the row one after the other, and the owner's renewal,
// whose share lock queued behind them, could come too late for a short
// lease on a loaded server (TestAcquireWriteLocksOnlyWhatItMayTake).
//
// # Renewals on PostgreSQL
//
// Extend does not write the record's row: it writes idem_renewals, one
// row per key holding the lease end of the owner and fence that last
// renewed it (migration 3). A business transaction under REPEATABLE READ
// or SERIALIZABLE whose snapshot predates a renewal would otherwise fail
// its CompleteTx with a serialization failure (SQLSTATE 40001): the
// renewal updated the row it completes, after its snapshot. A row lock
// held by a transaction that has ended is no such update, so Extend
// checks the record with SELECT … FOR SHARE (status processing, owner,
// fence) and upserts the renewal in the same statement.
//
// A processing record's lease is its renewal's when the renewal carries
// the record's owner and fence, and its own lease_until otherwise (an
// owner is 128 random bits: a renewal left by an earlier owner of the
// key never matches); its expiry is that lease + its retention. Every
// statement that decides on a lease or an expiry, or returns a record,
// reads records through the view idem_records_renewed (Get, Acquire's
// read) or applies the same rule (idem_acquire_write, idem_sweep). A
// completed record ignores renewals: its LeaseUntil is the one its
// acquisition wrote, since the completion, which runs in the caller's
// transaction, must not read what renewals write.
//
// Extend, a takeover and Sweep lock the record's row before they touch
// its renewal, so the lock orders them; whoever comes second sees what
// the first committed. An Extend that waits for a takeover re-reads the
// row once it is free (READ COMMITTED) and finds another owner: lease
// lost. A takeover that waits for an Extend reads the renewal in a
// statement that starts after its lock was granted (under READ
// COMMITTED, a new snapshot, which shows the renewal) and then finds the
// key in flight. Should the acquire statement ever run under REPEATABLE
// READ or SERIALIZABLE (the Store runs it at READ COMMITTED whatever the
// sessions' default_transaction_isolation, but the function does not
// rely on that), the function's statements would share the snapshot of
// the acquire statement and that read might miss a renewal; so a
// takeover also upserts the renewal row for its own lease, which fails
// with 40001 when the row changed after the snapshot, and Acquire runs
// again (TestExtendTakeoverRace). idem_sweep locks the expired records it finds (FOR
// UPDATE SKIP LOCKED), then decides in a later statement, in a READ
// COMMITTED transaction whatever the session's default; it deletes the
// renewals of the records it removes, and renewals that lapsed (their
// lease + retention passed) and are no processing record's lease.
// Release, Delete and DeleteIf leave a record's renewal to Sweep.
//
// CompleteTx under REPEATABLE READ or SERIALIZABLE still fails with 40001
// when someone else changed the record after the transaction's snapshot
// (a takeover, a completion, a release or a deletion); the server has
// aborted the transaction, so CompleteTx rolls it back (freeing its
// connection, which may be the pool's last: TestCompleteTxOnePool), reads
// the record on a connection of the Store's *sql.DB, and reports a
// takeover as [idem.ErrLeaseLost], wrapping the driver's error too.
//
// Renewals cost Extend an upsert into idem_renewals instead of an update
// of the record (one statement, one commit, as before: the same time,
// within the noise). A read that reports a processing record (Get, a
// duplicate in flight) calls idem_renewed_lease, about 20 µs on the
// project's machine; a completed record costs a few µs more than a read
// of the table (the view's plan), and its renewal is never read
// (docs/benchmarks.md). During a rolling upgrade, builds
// without migration 3 keep working against a migrated database (their
// Extend moves the record's own lease, which the new statements read
// when there is no renewal of that owner, and their Acquire calls the new
// idem_acquire_write), but their Sweep ignores renewals: run Sweep from
// upgraded builds only.
//
// # Acquire on MySQL and MariaDB
//
// MySQL has no RETURNING (MariaDB 10.5 and later has INSERT … RETURNING,
// also on an upsert, but one dialect serves both), so Acquire runs:
//
//  1. select_held, a consistent read that locks nothing: a replay, a
//     duplicate or a mismatch ends here (one round trip);
//  2. the upsert, INSERT … ON DUPLICATE KEY UPDATE, autocommitted on its
//     own: it inserts, or, under the row's exclusive lock, reads the
//     latest version of the row and takes it if it may: take = the
//     record is past expires_at, or it is processing with the same
//     fingerprint and its lease has ended. The first assignment sets
//     owner to ours if take holds; every later one assigns its new value
//     if "owner is ours or take holds". That reads the same whether the
//     server assigns left to right, each assignment seeing the values
//     assigned before it (MySQL; MariaDB by default), or evaluates every
//     right-hand side on the row as it was (MariaDB with
//     SIMULTANEOUS_ASSIGNMENT): left to right, owner is ours exactly
//     when the first assignment took the row, and otherwise nothing has
//     changed and take reads the old row; simultaneously, owner is never
//     ours and take reads the old row. A replacement (the record was
//     past expires_at, whatever its status) gives the record created_at
//     = now; a takeover keeps created_at. The statement reports what it
//     did in its OK packet: the inserted created_at is
//     LAST_INSERT_ID(now), so the insert id is the database's now, and
//     the update branch sets it with LAST_INSERT_ID(took): 1 if it took a
//     processing record (a takeover, or the replacement of an abandoned
//     one: TookOver), 2 if it replaced a completed one, 0 if it took
//     nothing. An insert id above 2 with one affected row is a new
//     record: fence 1, created at now, ours, and Acquire is done;
//  3. otherwise select_record: the record is ours if and only if it
//     carries our owner, a random 128-bit token no other caller has.
//     Nobody but the owner changes a record under a live lease, so it
//     then holds the fence and lease our upsert wrote. Another owner
//     means the upsert found the record not ours to take, and it is
//     reported.
//
// A new key costs two round trips and one commit; a replaced or
// taken-over key three. One statement for every outcome is not to be had
// on MySQL without making replays dearer: the upsert first (with
// MariaDB's RETURNING, one statement for every outcome) would take the
// row's exclusive lock for every replay and duplicate, so that a
// duplicate of a key completing in a CompleteTx would wait for that
// transaction to end instead of being answered at once; a stored procedure
// doing the read and then the upsert cost a replay 1.46× a SELECT 1
// where the plain read costs 1.1-1.3× (measured on MariaDB 10.11). Two
// concurrent upserts of a new key can deadlock on InnoDB's gap and
// insert-intention locks; InnoDB rolls one back (error 1213), and Acquire
// runs it again after a short pause, at most 8 times. A lock wait timeout
// (1205) is not retried. The statements run on autocommit connections, so
// the session's isolation level does not matter: each read is a fresh
// consistent read (InnoDB's SERIALIZABLE makes plain reads locking only
// when autocommit is off), and the upsert always reads the latest
// committed row. Requests on distinct keys do not fail each other under
// REPEATABLE READ, READ COMMITTED or SERIALIZABLE
// (TestDistinctKeysUnderIsolationDefault), so the Store does not wrap its
// statements in READ COMMITTED transactions on MySQL as it does on
// PostgreSQL.
//
// Extend on MySQL is one UPDATE that reports the new lease end as its
// insert id (LAST_INSERT_ID(expr); no RETURNING), 0 when it matched no
// row: MySQL's affected-rows count says "changed", not "matched", and an
// extension to the same millisecond changes nothing.
//
// Acquire on MySQL, when the upsert replaced or took over a record, reads
// the record back in a second statement. If the lease it wrote ends
// before that read, and another caller takes the key over in between
// (a lease shorter than one round trip, or a stalled connection), Acquire
// answers from the record it reads (InFlight, say) rather than Acquired,
// or, if the record was swept meanwhile, tries again and may acquire a
// new record: nobody ran under the lost lease, and the next fence is one
// higher than a history without the lost lease would give. The linearizability
// check of the stores (cmd/internal/lincheck) models this split.
//
// # MySQL and MariaDB: versions and sql_mode
//
// Supported: MySQL 8.0 and 8.4, and MariaDB 10.6 or later, with InnoDB.
// The statements use nothing that only one of them has (no VALUES() in
// ON DUPLICATE KEY UPDATE, deprecated since MySQL 8.0.20, nor the row
// alias that replaces it, which MariaDB lacks: the bound values are
// repeated; no RETURNING). Tested here: MariaDB only, 10.11
// (10.11.19-MariaDB, the development and CI machines' server); MySQL
// itself is not tested by this project.
//
// The store works whatever the session's sql_mode, so the server's
// default or a DSN's sql_mode need not change for it. Its statements
// write strings in single quotes and use no backslash, no || or && and
// no NOT operator, and the acquire upsert does not depend on the order
// of its assignments (above). The conformance suite and Migrate run under
// SIMULTANEOUS_ASSIGNMENT, ORACLE (MariaDB), ANSI, PIPES_AS_CONCAT +
// ANSI_QUOTES + NO_BACKSLASH_ESCAPES, and TRADITIONAL with all of these
// and clientFoundRows, and under MariaDB's EMPTY_STRING_IS_NULL, alone
// and with ORACLE (TestMySQLModeConformance, TestMySQLModeAcquire).
// EMPTY_STRING_IS_NULL turns an empty string bound to a statement into
// NULL (an empty string literal too, but not an empty hex literal), so
// every scope and fingerprint a statement binds, which may be empty, is
// written
//
//	COALESCE(?, X'')
//
// and the empty scope and the empty fingerprint are stored and found as
// empty strings under every mode. (An empty body is then stored as NULL,
// which reads back as the nil body it is anyway.)
//
// Migrate on MySQL takes GET_LOCK('idem_migrate', 30) on one connection
// and releases it at the end. MySQL commits every DDL statement on its
// own, so a migration is not one transaction; each migration is written
// to be rerun safely (CREATE TABLE IF NOT EXISTS, the index inside the
// CREATE TABLE). Migrate on PostgreSQL runs in one READ COMMITTED
// transaction holding pg_advisory_xact_lock, and rolls back as a whole.
//
// # Cost, measured
//
// BenchmarkVsRoundTrip measures each operation interleaved, in one loop,
// with the cheapest round trip of the same database (a prepared SELECT
// 1) and, for writes, a raw one-row INSERT (one durable commit), so that
// the ratios hold whatever the machine's load; docs/benchmarks.md keeps
// the figures. On the project's 2-core machine, with PostgreSQL 15 and
// MariaDB 10.11 on the same host (medians of five runs):
//
//	                 replay        Get (floor)   Acquire, new key  Complete
//	                 × SELECT 1    × SELECT 1    × INSERT          × INSERT
//	PostgreSQL       1.57          1.34          1.34              1.23
//	MariaDB          1.62          1.41          1.60              1.23
//	SQLite           10.9          9.1           1.54              1.17
//
// (Measured before migration 3; since, reads go through the view
// idem_records_renewed, a few µs dearer for a completed record: see
// "Renewals on PostgreSQL".) A replay costs one round trip and a
// primary-key read of the row with its stored response; Get, the plain read of the same row, is the floor
// of any answer that carries the record. A new key costs one statement
// and one commit on PostgreSQL, two round trips and one commit on MySQL.
//
// # SQLite: settings, and how they were chosen
//
// [github.com/idemkit/idem/sqlstore/sqlite.Open] opens the file in WAL mode with busy_timeout=10000,
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
// # Tokens
//
// [TokenStore] keeps the pre-issued submit tokens of package
// [github.com/idemkit/idem/token] in idem_tokens (PostgreSQL migration 4,
// MySQL migration 2, SQLite migration 3; Migrate of a Store or of a
// TokenStore applies them all): one row per token, keyed by its digest
// (the SHA-256 of the ID, never the ID), with the scope, created_at,
// expires_at, used_at (NULL while unused), the result of the first use
// (bytea/BLOB, NULL for none) and the fingerprint of its request (NULL
// for none; PostgreSQL migration 11, MySQL 7, SQLite 9, with an index on
// (scope, expires_at) for Trim), and an index on expires_at for
// TokenStore.Sweep. Insert is one INSERT; Consume is one UPDATE … WHERE
// digest = ? AND scope = ? AND used_at IS NULL AND expires_at > now, which
// also moves expires_at to now + Spend.Keep if that is later (a used token
// is kept a day after its use, by default), so
// of concurrent Consumes one changes the row and the others wait for its
// row lock and then find it used. When it changes nothing, a read tells a
// used token (its used_at and result) from an invalid one: on PostgreSQL
// that read is in the same statement (a data-modifying WITH), and only a
// token spent by a concurrent transaction after the statement's snapshot
// costs a second statement; on MySQL it is a locking read (LOCK IN SHARE
// MODE), which inside the caller's REPEATABLE READ transaction sees the
// row as the UPDATE did, not as the snapshot does. ConsumeTx runs the same
// statements in the caller's transaction ([token.Tokens.ConsumeTx]). Trim
// deletes a scope's unused tokens beyond its newest in one DELETE on
// PostgreSQL and SQLite; on MySQL, in a plain SELECT of them and a DELETE
// by primary key of each, since a DELETE over a derived table of
// idem_tokens locks the rows it reads and deadlocks with the
// application's ConsumeTx.
//
// # Retrying the application's transactions
//
// [Retryable] is the classification the Store applies to its own
// statements, exported for the application's transactions (the one a
// CompleteTx runs in, say): a PostgreSQL serialization failure (40001,
// which every write conflict is under a REPEATABLE READ or SERIALIZABLE
// default) or deadlock (40P01), a MySQL/MariaDB deadlock (1213). Such a
// transaction was rolled back whole and may simply run again, whole,
// including its CompleteTx (a rolled-back completion left nothing). A
// lock wait timeout (1205) is not retryable.
//
// # What this package does not guarantee
//
//   - The database's clock is the clock of its server (of the primary, on
//     PostgreSQL and MySQL): a step of that clock moves every lease. A
//     failover to a replica whose clock differs moves them too.
//   - On PostgreSQL and MySQL, a CompleteTx whose transaction stays open
//     holds the record's row lock: an Acquire that would take the record
//     over waits for it, up to the server's lock timeout (MySQL's
//     innodb_lock_wait_timeout, 50 s by default; PostgreSQL's lock_timeout,
//     none by default) or its context. Keep such transactions short.
//   - Acquire answers from a read that precedes its write: a replay that
//     finds a completed record reports the record as it was when read.
//     That is the contract's answer at that instant; the record may have
//     expired since (by at most a round trip).
//   - Acquire's retries are bounded (8 rounds of deadlock, serialisation
//     failure or a record changing under it): past them it fails with the
//     last error rather than spin.
//   - On SQLite with one connection, a goroutine that holds a transaction
//     and then calls db, or a method of the Store other than CompleteTx,
//     waits for the connection its own transaction holds, until its
//     context ends. Inside a transaction, use the transaction only.
//   - On SQLite, while a transaction that called CompleteTx is open it
//     holds the database's write lock (and, under sqlite.Open, its only connection):
//     every other write waits for it. Keep such transactions short.
//   - SQLite's clock is the clock of the host that runs the statement. The
//     processes sharing a SQLite file share a host, so they share a clock;
//     a step of that clock moves every lease. Do not put a SQLite database
//     on a network file system: its locks are not reliable there.
//   - AcquireResult.TookOver is informational: the fence is what protects
//     the record. SQLite and PostgreSQL keep it in a took_over column;
//     MySQL reports it through the acquire statement's insert id, and a
//     driver that reports no insert id leaves it false.
//   - A database migrated by a newer version of this package is used as
//     it is; Migrate does not downgrade.
//   - Expired tokens stay in idem_tokens until TokenStore.Sweep removes
//     them; they answer token.ErrInvalid meanwhile. A ConsumeTx whose
//     transaction stays open holds the token's row lock (on SQLite, the
//     write lock), and a concurrent Consume of that token waits for it up
//     to the server's lock timeout: keep such transactions short.
//
// # Locks
//
// [LockBackend] is a [lock.Backend] on the same database: the table
// idem_locks (created by Migrate) keeps a row per lock name with its
// owner, fence and lease. Acquire is one upsert that takes the row when it
// is free or its lease has ended (fence + 1, RETURNING on PostgreSQL and
// SQLite, the insert id of LAST_INSERT_ID(expr) on MySQL, correct under
// MariaDB's SIMULTANEOUS_ASSIGNMENT); Extend and Release are one
// conditional UPDATE each, on owner, fence and a live lease. Release
// clears the owner and keeps the row, so the fence survives release and
// expiry. Leases are counted on the database's clock, in whole
// milliseconds rounded up plus one (the database's "now" is truncated to
// the millisecond), so no lease is shorter than asked.
//
// # Inbox
//
// [InboxStore] is an [inbox.TxStore]: the consume records of package
// [github.com/idemkit/idem/inbox] in idem_inbox (PostgreSQL migrations 7
// and 8, MySQL migration 5, SQLite migrations 6 and 7), one row per (message_id,
// consumer_group) with status, attempts, fence, lease_until, last_error,
// created_at and updated_at (unix milliseconds on the database's clock).
// A claim of a new message is one INSERT that does nothing when the
// record exists (ON CONFLICT DO NOTHING; on MySQL a no-op ON DUPLICATE KEY
// UPDATE that takes the row lock); a claim of a known message reads the
// row under a row lock (FOR UPDATE; SQLite's write lock) and updates it if
// it takes it over, in the caller's transaction for ClaimTx or in one of
// its own. ClaimTx writes the record succeeded, so that it commits with
// the effect the caller writes in the same transaction (Inbox.HandleTx);
// a concurrent claim of the message waits for that transaction. Finish,
// Fail and Extend are one UPDATE each, conditional on the fence (and, for
// Extend, a live lease). Sweep is one DELETE of up to limit records past
// a retention: succeeded, failed and dead ones by updated_at, processing
// ones by the end of their lease (never one whose lease is live), found
// through an index on updated_at (SKIP LOCKED on PostgreSQL). Keep transactions that hold a
// record short: a duplicate delivery waits for them up to the server's
// lock timeout. As the Store's, the InboxStore's statements outside the
// caller's transaction run at READ COMMITTED whatever PostgreSQL's
// default_transaction_isolation (alone, or each in a READ COMMITTED
// transaction of its own), and Claim's own transaction begins at READ
// COMMITTED, so that claims and finishes of distinct messages never fail
// each other with serialization failures; ClaimTx, FinishTx and ReviveTx
// run at the caller's level.
//
// For operators, List reads the records of one status (dead messages,
// failed ones waiting for their redelivery, processing ones whose
// consumer may have died), least recently updated first, and Revive makes
// a dead record failed with no attempt counted, so that the message,
// published again with its ID, is handled again (ReviveTx does it in the
// transaction that writes the message again to an outbox).
//
// # Outbox
//
// [OutboxStore] is an [outbox.Store] in idem_outbox (see its doc for how
// a batch holds its rows); a batch's transaction begins at READ
// COMMITTED, and Sweep and Backlog run at READ COMMITTED whatever
// PostgreSQL's default_transaction_isolation, as the Store's statements
// do, while Add runs in the caller's transaction at the caller's level.
package sqlstore
