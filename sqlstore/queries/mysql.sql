-- Statements of the MySQL dialect (MySQL 8.0 and MariaDB 10.5 or later).
--
-- Each statement starts with "-- name: NAME" and lists the parameters it
-- binds, in order, on a "-- params:" line, one entry per ? (MySQL's
-- placeholders cannot repeat, so a value used twice is listed twice).
-- Times are BIGINT unix milliseconds. "now" is the database's clock:
--
--     (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
--
-- written out in full in every statement below. UTC_TIMESTAMP, like NOW, is the time the statement
-- began, constant within the statement, also inside a long transaction
-- (SYSDATE would change from call to call). It is used rather than
-- UNIX_TIMESTAMP(NOW(3)) because NOW is in the session's time zone, whose
-- conversion back to an instant is ambiguous for an hour each autumn
-- under daylight saving time; the arithmetic above involves no time zone.

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS idem_schema_migrations (
    version    BIGINT       NOT NULL PRIMARY KEY,
    name       VARCHAR(255) NOT NULL,
    applied_at BIGINT       NOT NULL
) ENGINE = InnoDB;

-- name: lock_schema
-- Nothing to do: Migrate's connection already holds
-- GET_LOCK('idem_migrate').

-- name: select_migrations
SELECT version FROM idem_schema_migrations ORDER BY version;

-- name: insert_migration
-- params: version name
INSERT INTO idem_schema_migrations (version, name, applied_at)
VALUES (?, ?, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000));

-- name: acquire
-- params: scope key fingerprint owner lease_ms retention_ms lease_ms retention_ms
-- Inserts a new record or, in the same statement, replaces a record past
-- its expiry (whatever its status and fingerprint) or takes over a
-- processing record with the same fingerprint whose lease has ended.
-- MySQL has no RETURNING (MariaDB 10.5's would do, but the dialect
-- serves both), so the statement says what it did through its OK packet: created_at is written as LAST_INSERT_ID(now), which makes the
-- insert id the database's now, and the update branch's first
-- assignment evaluates LAST_INSERT_ID(0). An insert id above 0 with one
-- affected row is therefore a new record: fence 1, created at now, ours.
-- Anything else the caller reads back; the record is ours if its owner
-- is the random owner we wrote.
--
-- ON DUPLICATE KEY UPDATE assigns left to right and each assignment sees
-- the values assigned before it. So the decision is taken once, by the
-- first assignment, on the row as it was: owner becomes ours only if the
-- row may be taken. Every later assignment tests owner = VALUES(owner),
-- which holds exactly when the first one took the row (an owner is 128
-- random bits; no other row has ours). fence and created_at come before
-- status, whose old value created_at reads: a takeover keeps created_at,
-- so created_at <> lease_until - lease_ms tells it apart.
INSERT INTO idem_records (
    scope, idempotency_key, fingerprint, status, owner, fence,
    lease_until, retention_ms, created_at, expires_at)
VALUES (
    ?, ?, ?, 'processing', ?, 1,
    (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ?, ?, LAST_INSERT_ID((TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)), (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ? + ?)
ON DUPLICATE KEY UPDATE
    owner           = IF(LAST_INSERT_ID(0) = 0 AND (expires_at <= VALUES(created_at)
                         OR (status = 'processing' AND fingerprint = VALUES(fingerprint)
                             AND lease_until <= VALUES(created_at))),
                         VALUES(owner), owner),
    fence           = IF(owner = VALUES(owner), fence + 1, fence),
    created_at      = IF(owner = VALUES(owner) AND status <> 'processing', VALUES(created_at), created_at),
    fingerprint     = IF(owner = VALUES(owner), VALUES(fingerprint), fingerprint),
    status          = IF(owner = VALUES(owner), 'processing', status),
    lease_until     = IF(owner = VALUES(owner), VALUES(lease_until), lease_until),
    retention_ms    = IF(owner = VALUES(owner), VALUES(retention_ms), retention_ms),
    response_status = IF(owner = VALUES(owner), NULL, response_status),
    response_header = IF(owner = VALUES(owner), NULL, response_header),
    response_body   = IF(owner = VALUES(owner), NULL, response_body),
    body_omitted    = IF(owner = VALUES(owner), FALSE, body_omitted),
    completed_at    = IF(owner = VALUES(owner), NULL, completed_at),
    expires_at      = IF(owner = VALUES(owner), VALUES(expires_at), expires_at);

-- name: select_record
-- params: scope key
SELECT scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM idem_records
WHERE scope = ? AND idempotency_key = ?;

-- name: select_held
-- params: scope key fingerprint
-- The record, if Acquire cannot take it: live and completed, live and
-- processing under a lease that has not ended, or bound to another
-- fingerprint. Acquire reads it first, so that a replay or a duplicate
-- costs one read and no write.
SELECT scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM idem_records
WHERE scope = ? AND idempotency_key = ?
  AND expires_at > (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
  AND (status = 'completed' OR fingerprint <> ? OR lease_until > (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000));

-- name: complete
-- params: response_status response_header response_body body_omitted retention_ms retention_ms scope key owner fence
UPDATE idem_records SET
    status          = 'completed',
    response_status = ?,
    response_header = ?,
    response_body   = ?,
    body_omitted    = ?,
    retention_ms    = ?,
    completed_at    = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000),
    expires_at      = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ?
WHERE scope = ? AND idempotency_key = ?
  AND status = 'processing' AND owner = ? AND fence = ?;

-- name: extend
-- params: lease_ms lease_ms scope key owner fence
-- Followed by select_lease (no RETURNING on MySQL). Its affected-rows
-- count is not used: MySQL counts changed rows, and an extension to the
-- same millisecond changes nothing.
UPDATE idem_records SET
    lease_until = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ?,
    expires_at  = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ? + retention_ms
WHERE scope = ? AND idempotency_key = ?
  AND status = 'processing' AND owner = ? AND fence = ?;

-- name: select_lease
-- params: scope key owner fence
SELECT lease_until FROM idem_records
WHERE scope = ? AND idempotency_key = ?
  AND status = 'processing' AND owner = ? AND fence = ?;

-- name: release
-- params: scope key owner fence
DELETE FROM idem_records
WHERE scope = ? AND idempotency_key = ?
  AND status = 'processing' AND owner = ? AND fence = ?;

-- name: delete
-- params: scope key
DELETE FROM idem_records WHERE scope = ? AND idempotency_key = ?;

-- name: sweep
-- params: limit
-- Walks idem_records_expires_at. The status test is redundant (a
-- processing record expires retention after its lease ends) and keeps a
-- live lease safe whatever expires_at says.
DELETE FROM idem_records
WHERE expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
  AND (status = 'completed' OR lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000))
ORDER BY expires_at
LIMIT ?;
