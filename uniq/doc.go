// Package uniq makes an insert idempotent on a business unique key:
// "insert, and on a duplicate read what is there" — never "select, then
// insert", which lets two concurrent callers both see nothing and both
// insert (or one of them fail).
//
// [IsDuplicate] classifies the duplicate-key errors of the common
// database/sql drivers (pgx and lib/pq for PostgreSQL, go-sql-driver/mysql
// for MySQL and MariaDB, modernc.org/sqlite and mattn/go-sqlite3 for
// SQLite) without importing any of them. [InsertOrGet] runs an insert and,
// on a duplicate, a get, with *sql.DB, *sql.Tx or *sql.Conn.
// [InsertBatch] inserts many rows, skipping those whose key is there, and
// reports per row whether it was created or already there: a bulk import
// run again after a crash writes each row once.
//
// # Shapes
//
// One function, InsertOrGet(ctx, q, insert, get, opts...): the Querier
// first after ctx, the two statements as functions, and per-call
// [Option]s ([Attempts]) last, as fsm's Table.Transition takes its
// options. Errors are a sentinel and a typed error that matches it with
// errors.Is: [ErrNotVisible] / [*NotVisibleError] — retry the whole
// transaction (classify it retryable, like a serialisation failure) — and
// [ErrUnresolved] / [*UnresolvedError] — a bug (another unique constraint
// fired, or get cannot find the row), which a retry does not fix. Both
// wrap the insert's duplicate-key error.
//
// # What it guarantees
//
//   - Of any number of concurrent InsertOrGet calls on one key (on any
//     number of processes), the database's unique index lets exactly one
//     insert succeed: that caller gets created = true, every other one gets
//     the row it created, with created = false.
//   - In a *sql.Tx (or a wrapper of one with its Commit and Rollback
//     methods, as sqlx's *Tx), the insert runs in a savepoint, so a
//     duplicate leaves the transaction usable on PostgreSQL (where a failed
//     statement otherwise aborts it) and the caller's transaction still
//     commits.
//   - A duplicate that get cannot read back is never reported as success:
//     in a PostgreSQL transaction whose snapshot cannot see it (REPEATABLE
//     READ, SERIALIZABLE) it is a [*NotVisibleError]; otherwise (a
//     collision on another unique constraint, a get that does not read by
//     the key, a row deleted before each of the attempts) an
//     [*UnresolvedError].
//   - Of concurrent InsertBatch calls with overlapping keys, exactly one
//     reports each key Created and the table holds it once; a row never
//     reports Created or Existing unless its statement committed (in the
//     caller's transaction: unless the caller commits).
//   - IsDuplicate is true only for unique and primary-key violations, never
//     for foreign-key, not-null or check violations, and never from a
//     message's text.
//
// # What it does not guarantee
//
//   - It protects what the unique index covers, nothing else: the index
//     must exist, on the business key (an order's external reference, a
//     payment's provider id), and get must read by that key.
//   - created = false says the row exists, not that it was created with
//     the same values: compare what get returns with what you meant to
//     insert if that matters (a request reusing a key with other data).
//   - Effects outside the database that follow the insert are not covered:
//     run them only when created is true, or record them in the same
//     transaction.
//   - In a MySQL/MariaDB transaction under REPEATABLE READ (the default),
//     get must use a locking read (LOCK IN SHARE MODE or FOR SHARE) to see
//     a row committed after the transaction's snapshot; on PostgreSQL under
//     REPEATABLE READ or SERIALIZABLE it cannot see such a row at all, and
//     InsertOrGet answers a NotVisibleError (retry the transaction). Such a
//     snapshot cannot tell that from a collision on another constraint:
//     a retried transaction that meets ErrNotVisible again points there.
//     A plain get in a MySQL/MariaDB transaction that cannot see the row
//     answers an UnresolvedError, as the bug it is.
//   - A unique constraint that PostgreSQL checks at COMMIT (DEFERRABLE
//     INITIALLY DEFERRED) is not met by the insert in a transaction: the
//     insert succeeds, InsertOrGet reports created = true, and the COMMIT
//     fails with the duplicate (IsDuplicate holds for its error) — every
//     retry of the transaction alike. Run SET CONSTRAINTS name IMMEDIATE
//     in the transaction before InsertOrGet, or make the constraint
//     immediate (the default). On a *sql.DB each statement commits at
//     once, so the insert meets the duplicate.
//   - The insert must be a single statement: a multi-statement insert
//     function that fails on its second statement with a duplicate is rolled
//     back to the savepoint in a transaction, but outside one its first
//     statement stays.
package uniq
