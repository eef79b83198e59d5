-- Statements of the PostgreSQL dialect.
--
-- Each statement starts with "-- name: NAME" and lists the parameters it
-- binds, in order, on a "-- params:" line; $1, $2, … refer to that list.
-- Times are bigint unix milliseconds. "now" is the database's clock,
--
--     floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
--
-- written out in full in every statement below. statement_timestamp() is
-- the time the statement began: constant within the statement, so every
-- use of it agrees, and the real time even inside a long transaction.
-- now() would be the time the transaction began, and CompleteTx runs in
-- the caller's transaction, which may have begun long before: its
-- completed_at and expires_at must be the time of the completion.
-- clock_timestamp() changes from call to call within a statement.

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS idem_schema_migrations (
    version    bigint NOT NULL PRIMARY KEY,
    name       text   NOT NULL,
    applied_at bigint NOT NULL
);

-- name: lock_schema
-- Serialises migrations across connections and processes until the
-- migration transaction ends; the key is an arbitrary constant of this
-- package.
SELECT pg_advisory_xact_lock(7307147133373130061);

-- name: select_migrations
SELECT version FROM idem_schema_migrations ORDER BY version;

-- name: insert_migration
-- params: version name
INSERT INTO idem_schema_migrations (version, name, applied_at)
VALUES ($1, $2, floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint);

-- name: acquire
-- params: scope key fingerprint owner lease_ms retention_ms
-- The whole of Acquire in one statement. The first branch is the record
-- if Acquire cannot take it (live and completed, processing under a live
-- lease, or bound to another fingerprint), read from the statement's
-- snapshot without a lock: a replay or a duplicate costs this read and
-- nothing else (no row is locked, no transaction id is assigned, nothing
-- is written or flushed, and idem_acquire_write is never called).
-- Otherwise idem_acquire_write (migration 2) inserts a new record, or
-- replaces a record past its expiry, or takes over a processing record
-- with the same fingerprint whose lease has ended; when its insert meets
-- a row this statement's snapshot did not show and that is not ours to
-- take, it returns that row, read in a new snapshot. The record is ours
-- if and only if its owner is the owner we passed. No row means the
-- record met vanished in between: the caller runs the statement again.
SELECT scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM idem_records
WHERE scope = $1 AND idempotency_key = $2
  AND expires_at > floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
  AND (status = 'completed' OR fingerprint <> $3 OR lease_until > floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint)
UNION ALL
SELECT scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM idem_acquire_write($1::text, $2::text, $3::text, $4::text, $5::bigint, $6::bigint)
WHERE NOT EXISTS (
    SELECT 1 FROM idem_records
    WHERE scope = $1 AND idempotency_key = $2
      AND expires_at > floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
      AND (status = 'completed' OR fingerprint <> $3 OR lease_until > floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint));

-- name: select_record
-- params: scope key
SELECT scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM idem_records
WHERE scope = $1 AND idempotency_key = $2;

-- name: select_held
-- Not used: the acquire statement reads the held record itself (and
-- idem_acquire_write when it must).

-- name: complete
-- params: scope key owner fence response_status response_header response_body body_omitted retention_ms
-- It returns the record's other columns, so that Store.CompleteRecord
-- needs no read; no row means the lease is lost.
UPDATE idem_records SET
    status          = 'completed',
    response_status = $5,
    response_header = $6,
    response_body   = $7,
    body_omitted    = $8,
    retention_ms    = $9,
    completed_at    = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint,
    expires_at      = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint + $9
WHERE scope = $1 AND idempotency_key = $2
  AND status = 'processing' AND owner = $3 AND fence = $4
RETURNING fingerprint, lease_until, created_at, completed_at, expires_at;

-- name: extend
-- params: scope key owner fence lease_ms
UPDATE idem_records SET
    lease_until = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint + $5,
    expires_at  = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint + $5 + retention_ms
WHERE scope = $1 AND idempotency_key = $2
  AND status = 'processing' AND owner = $3 AND fence = $4
RETURNING lease_until;

-- name: select_lease
-- Not used: extend returns lease_until.

-- name: release
-- params: scope key owner fence
DELETE FROM idem_records
WHERE scope = $1 AND idempotency_key = $2
  AND status = 'processing' AND owner = $3 AND fence = $4;

-- name: delete
-- params: scope key
DELETE FROM idem_records WHERE scope = $1 AND idempotency_key = $2;

-- name: sweep
-- params: limit
-- The inner query walks idem_records_expires_at; SKIP LOCKED leaves rows
-- another transaction holds (a CompleteTx in progress, a concurrent
-- sweep) to a later sweep instead of waiting for them, and the lock
-- rechecks the conditions on the row's latest version. The status test
-- is redundant (a processing record expires retention after its lease
-- ends) and keeps a live lease safe whatever expires_at says.
DELETE FROM idem_records WHERE ctid IN (
    SELECT ctid FROM idem_records
    WHERE expires_at <= floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
      AND (status = 'completed' OR lease_until <= floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint)
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED);
