-- Statements of the MySQL dialect (MySQL 8.0 and 8.4, MariaDB 10.6 or
-- later). They read alike under any sql_mode: strings in single quotes,
-- no backslash, no || or &&, no NOT operator, no assignment that depends
-- on the order in which ON DUPLICATE KEY UPDATE or UPDATE assigns (see
-- acquire), and every scope and fingerprint bound as COALESCE(?, X''):
-- MariaDB's EMPTY_STRING_IS_NULL turns an empty string bound to a
-- statement into NULL (the literal '' too, but not X''), and the empty
-- scope and fingerprint are legitimate values.
--
-- Each statement starts with "-- name: NAME" and lists the parameters it
-- binds, in order, on "-- params:" lines, one entry per ? (MySQL's
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
-- params: fingerprint owner
-- params: owner fingerprint
-- params: owner fingerprint
-- params: owner fingerprint fingerprint
-- params: owner fingerprint
-- params: owner fingerprint lease_ms
-- params: owner fingerprint retention_ms
-- params: owner fingerprint
-- params: owner fingerprint
-- params: owner fingerprint
-- params: owner fingerprint
-- params: owner fingerprint
-- params: owner fingerprint lease_ms retention_ms
-- (The params lines list the ? of the INSERT's values and then those of
-- each assignment, in order, one line each.)
--
-- Inserts a new record or, in the same statement, replaces a record past
-- its expiry (whatever its status and fingerprint) or takes over a
-- processing record with the same fingerprint whose lease has ended.
-- MySQL has no RETURNING (MariaDB's would do, but the dialect serves
-- both), so the statement says what it did through its OK packet, whose
-- insert id is the last value given to LAST_INSERT_ID(expr):
--
--   - an insert: created_at is written as LAST_INSERT_ID(now), so the
--     insert id is the database's now (a large number), with one affected
--     row: a new record, fence 1, created at now, ours;
--   - an update: the first assignment evaluates LAST_INSERT_ID(took),
--     where took is 1 if it takes a processing record (a takeover, or the
--     replacement of an abandoned one), 2 if it replaces an expired
--     completed record, and 0 if the row is not ours to take. The caller
--     then reads the record back: it is ours if its owner is the random
--     owner we wrote.
--
-- The statement does not depend on the order in which ON DUPLICATE KEY
-- UPDATE assigns. MySQL, and MariaDB by default, assign left to right and
-- each right-hand side sees the values assigned before it; MariaDB with
-- SIMULTANEOUS_ASSIGNMENT in sql_mode (which sql_mode=ORACLE sets)
-- evaluates every right-hand side on the row as it was. So the decision
-- is written out in every assignment:
--
--   take = expires_at <= now
--          OR (status = 'processing' AND fingerprint = ? AND lease_until <= now)
--
-- The first assignment sets owner to ours if take holds on the row as it
-- was (it is the first: the row is as it was in either mode; took > 0
-- exactly when take holds). Every later
-- one assigns its new value when "owner = our owner OR take" holds:
--
--   - left to right, if the first assignment took the row, owner is ours
--     (an owner is 128 random bits; no other row has ours) and the
--     condition holds whatever take now reads; if it did not, no
--     assignment has changed anything and take reads the row as it was,
--     false;
--   - simultaneously, owner is the old one, never ours, and take reads
--     the row as it was.
--
-- created_at becomes now when the record is replaced (it was past
-- expires_at), and is kept by a takeover. It reads expires_at, so it
-- comes before expires_at's assignment. No other assignment reads a column
-- but its own (and those of the condition). VALUES() is not used (it is
-- deprecated in MySQL 8.0.20): the bound values are repeated instead.
--
-- The text uses only what every sql_mode reads alike (CASE rather than
-- IF(), and see the top of this file).
INSERT INTO idem_records (
    scope, idempotency_key, fingerprint, status, owner, fence,
    lease_until, retention_ms, created_at, expires_at)
VALUES (
    COALESCE(?, X''), ?, COALESCE(?, X''), 'processing', ?, 1,
    (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ?,
    ?,
    LAST_INSERT_ID((TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)),
    (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ? + ?)
ON DUPLICATE KEY UPDATE
    owner = CASE WHEN LAST_INSERT_ID(
                CASE WHEN status = 'processing'
                          AND (expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
                               OR (fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
                     THEN 1
                     WHEN expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
                     THEN 2
                     ELSE 0 END) > 0
        THEN ? ELSE owner END,
    created_at = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
             AND expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
        THEN (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) ELSE created_at END,
    fence = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN fence + 1 ELSE fence END,
    fingerprint = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN COALESCE(?, X'') ELSE fingerprint END,
    status = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN 'processing' ELSE status END,
    lease_until = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ? ELSE lease_until END,
    retention_ms = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN ? ELSE retention_ms END,
    response_status = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN NULL ELSE response_status END,
    response_header = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN NULL ELSE response_header END,
    response_body = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN NULL ELSE response_body END,
    body_omitted = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN FALSE ELSE body_omitted END,
    completed_at = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN NULL ELSE completed_at END,
    expires_at = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ? + ? ELSE expires_at END;

-- name: select_record
-- params: scope key
SELECT scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM idem_records
WHERE scope = COALESCE(?, X'') AND idempotency_key = ?;

-- name: select_record_in_tx
-- params: scope key
-- The record as the completion in the caller's transaction saw it, after
-- the completion matched nothing: a locking read, which reads the latest
-- committed version of the row as the UPDATE did, whatever the
-- transaction's isolation level (a plain read under REPEATABLE READ would
-- read the transaction's snapshot, which may predate the completion or
-- takeover that made the UPDATE match nothing). It runs on the
-- transaction's connection: a read on another connection of the pool
-- would wait for the transaction's own when the pool has one. The shared
-- lock lasts until the transaction ends, which the caller then rolls
-- back. LOCK IN SHARE MODE is the spelling MySQL 8 and MariaDB both read.
SELECT scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM idem_records
WHERE scope = COALESCE(?, X'') AND idempotency_key = ?
LOCK IN SHARE MODE;

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
WHERE scope = COALESCE(?, X'') AND idempotency_key = ?
  AND expires_at > (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
  AND (status = 'completed' OR fingerprint <> COALESCE(?, X'') OR lease_until > (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000));

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
WHERE scope = COALESCE(?, X'') AND idempotency_key = ?
  AND status = 'processing' AND owner = ? AND fence = ?;

-- name: extend
-- params: lease_ms lease_ms scope key owner fence
-- MySQL has no RETURNING: the statement reports the new lease end as its
-- insert id, the last value given to LAST_INSERT_ID(expr), which the
-- assignment evaluates for the row it matched (changed or not); a
-- statement that matched no row reports 0. Its affected-rows count is not
-- used: MySQL counts changed rows, and an extension to the same
-- millisecond changes nothing. A driver that does not report the insert
-- id makes the store read the lease back with select_lease.
UPDATE idem_records SET
    lease_until = LAST_INSERT_ID((TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ?),
    expires_at  = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ? + retention_ms
WHERE scope = COALESCE(?, X'') AND idempotency_key = ?
  AND status = 'processing' AND owner = ? AND fence = ?;

-- name: select_lease
-- params: scope key owner fence
-- After extend, when the driver does not report its insert id.
SELECT lease_until FROM idem_records
WHERE scope = COALESCE(?, X'') AND idempotency_key = ?
  AND status = 'processing' AND owner = ? AND fence = ?;

-- name: release
-- params: scope key owner fence
DELETE FROM idem_records
WHERE scope = COALESCE(?, X'') AND idempotency_key = ?
  AND status = 'processing' AND owner = ? AND fence = ?;

-- name: delete
-- params: scope key
DELETE FROM idem_records WHERE scope = COALESCE(?, X'') AND idempotency_key = ?;

-- name: delete_if
-- params: scope key owner fence
-- Store.DeleteIf: no row affected means the record is gone or another's;
-- select_record then tells which.
DELETE FROM idem_records
WHERE scope = COALESCE(?, X'') AND idempotency_key = ? AND owner = ? AND fence = ?;

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

-- name: list
-- params: limit
-- Store.List: the oldest records first. An operator's read (idem
-- inspect): it scans the table and sorts, which no index serves.
SELECT scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM idem_records
ORDER BY created_at, scope, idempotency_key
LIMIT ?;

-- name: list_status
-- params: status limit
SELECT scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM idem_records
WHERE status = ?
ORDER BY created_at, scope, idempotency_key
LIMIT ?;

-- Tokens (package token; TokenStore). idem_tokens comes with migration 2.
-- Scopes are never empty (token.ErrScope), so they need no COALESCE; an
-- empty result is NULL under any sql_mode, and reads back as nil.

-- name: token_insert
-- params: digest scope ttl_ms
-- The insert id is the database's now (LAST_INSERT_ID(expr) in the
-- values), so expires_at = insert id + ttl_ms needs no read. A stored
-- digest fails with ER_DUP_ENTRY (token.ErrDuplicate).
INSERT INTO idem_tokens (digest, scope, created_at, expires_at)
VALUES (?, ?,
        LAST_INSERT_ID((TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)),
        (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ?);

-- name: token_consume
-- params: result token_fingerprint keep_ms digest scope
-- Spends the live, unused token of the scope — used_at, result and
-- fingerprint set, expires_at moved to now + keep_ms if that is later —
-- in one affected row (also under CLIENT_FOUND_ROWS: the row found is the
-- row changed, since used_at goes from NULL to a time). No row: used, or
-- no live token of the scope; token_select tells which. The UPDATE's read
-- is a locking, current read: it waits for a transaction that holds the
-- row (a ConsumeTx in progress) and sees what it committed.
UPDATE idem_tokens SET
    used_at     = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000),
    result      = ?,
    fingerprint = ?,
    expires_at  = GREATEST(expires_at, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ?)
WHERE digest = ? AND scope = ? AND used_at IS NULL
  AND expires_at > (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000);

-- name: token_select
-- params: digest scope
-- The live token of the scope: used_at (NULL if unused), result and
-- fingerprint. A locking read, so that inside a REPEATABLE READ
-- transaction (ConsumeTx) it sees the row as the UPDATE just did, not as
-- the transaction's snapshot does.
SELECT used_at, result, fingerprint FROM idem_tokens
WHERE digest = ? AND scope = ?
  AND expires_at > (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
LOCK IN SHARE MODE;

-- name: token_trim
-- params: scope keep
-- The scope's unused tokens but its keep newest (by expires_at, then
-- digest; expired ones come last), walking idem_tokens_scope_expires_at:
-- TokenStore.Trim deletes each with token_trim_delete. A plain SELECT is
-- a consistent read and locks nothing; one DELETE over a derived table of
-- idem_tokens (MySQL refuses a LIMIT in a subquery of the table it
-- deletes from) would read it with shared next-key locks under REPEATABLE
-- READ, on every row it scans — other scopes' included when the
-- optimiser scans the table — and deadlock with the ConsumeTx of an
-- application's transaction.
SELECT digest FROM idem_tokens
WHERE scope = ? AND used_at IS NULL
ORDER BY expires_at DESC, digest DESC
LIMIT ?, 18446744073709551615;

-- name: token_trim_delete
-- params: digest scope
-- Deletes one token token_trim found, if it is still unused: a locking
-- read of its primary key only. A token spent meanwhile stays.
DELETE FROM idem_tokens WHERE digest = ? AND scope = ? AND used_at IS NULL;

-- name: token_sweep
-- params: limit
-- Deletes up to limit expired tokens, used or not, walking
-- idem_tokens_expires_at.
DELETE FROM idem_tokens
WHERE expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
ORDER BY expires_at
LIMIT ?;

-- Statements of LockBackend (package lock), on idem_locks (migration
-- "locks"). lease_ms is the TTL in whole milliseconds rounded up, plus
-- one for the truncation of "now" to the millisecond: the lease never
-- ends before the TTL has passed since the statement began.

-- name: lock_acquire
-- params: name owner lease_ms owner owner lease_ms
-- Inserts the name's row, or takes it, fence + 1, if it is free (no
-- owner) or its lease has ended. MySQL has no RETURNING: the statement
-- reports the fence as its insert id, the last value given to
-- LAST_INSERT_ID(expr) — 1 for a new row (the VALUES), and for an
-- existing row the value the first assignment gives it: the new fence if
-- it takes the row, 0 if the row is held (ErrHeld).
--
-- As for the acquire of idem_records, the statement does not depend on
-- the order in which ON DUPLICATE KEY UPDATE assigns (left to right,
-- each right-hand side seeing the values assigned before it, in MySQL
-- and MariaDB by default; all on the row as it was under MariaDB's
-- SIMULTANEOUS_ASSIGNMENT):
--
--   take = owner = X'' OR lease_until <= now
--
-- (X'', not '': under MariaDB's EMPTY_STRING_IS_NULL the literal '' is
-- NULL, which owner = '' never equals and a release could not write into
-- the NOT NULL column in a strict mode; a hexadecimal literal stays an
-- empty string.)
--
--   - fence comes first: its take reads the row as it was in both modes;
--   - owner reads only its own column and lease_until, not yet assigned
--     in either mode;
--   - lease_until comes last and assigns when "owner = our owner OR
--     take": left to right, owner is ours exactly when the row was taken
--     (an owner is 128 random bits that no row holds), and when it was
--     not, nothing changed and take is false; simultaneously, owner is
--     the old one, never ours, and take reads the row as it was.
INSERT INTO idem_locks (name, owner, fence, lease_until)
VALUES (?, ?, LAST_INSERT_ID(1),
        (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ?)
ON DUPLICATE KEY UPDATE
    fence = CASE WHEN LAST_INSERT_ID(
                CASE WHEN owner = X''
                          OR lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
                     THEN fence + 1 ELSE 0 END) > 0
        THEN fence + 1 ELSE fence END,
    owner = CASE WHEN owner = X''
                      OR lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
        THEN ? ELSE owner END,
    lease_until = CASE WHEN owner = ? OR owner = X''
                      OR lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
        THEN (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ? ELSE lease_until END;

-- name: lock_extend
-- params: lease_ms name owner fence
-- Compare-and-extend. MySQL reports changed rows, not matched ones, and
-- an extension to the same millisecond changes nothing: the match is
-- reported as the insert id instead, the new lease_until (> 0) given to
-- LAST_INSERT_ID(expr), which no row evaluates when none matches (0).
UPDATE idem_locks
SET lease_until = LAST_INSERT_ID((TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ?)
WHERE name = ? AND owner = ? AND fence = ?
  AND lease_until > (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000);

-- name: lock_release
-- params: name owner fence
-- Compare-and-delete: the row, and its fence, stay; the owner goes (a
-- change, so the affected-rows count is 1 on a match).
UPDATE idem_locks
SET owner = X'', lease_until = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
WHERE name = ? AND owner = ? AND fence = ?
  AND lease_until > (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000);

-- Outbox (OutboxStore, outbox.go): statements whose names start with
-- "outbox_".

-- name: outbox_insert
-- params: message_id topic msg_key payload headers
-- msg_id is the message's ID, made by OutboxStore.Add (outbox.NewID).
-- The key and the payload may be empty: COALESCE(?, X''), as the scopes
-- (EMPTY_STRING_IS_NULL binds them as NULL).
INSERT INTO idem_outbox (msg_id, topic, msg_key, payload, headers, created_at)
VALUES (?, ?, COALESCE(?, X''), COALESCE(?, X''), ?, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000));

-- name: outbox_claim
-- params: limit
-- The pending heads (see queries/postgres.sql), locked with SKIP LOCKED
-- (MySQL 8, MariaDB 10.6). The batch's transaction is READ COMMITTED, so
-- the locking read takes no gap locks: an Add is never blocked by a
-- relay's batch.
SELECT o.id, o.msg_id, o.topic, o.msg_key, o.payload, o.headers, o.created_at
FROM idem_outbox o
WHERE o.sent_at IS NULL
  AND (o.msg_key = X'' OR NOT EXISTS (
      SELECT 1 FROM idem_outbox p
      WHERE p.msg_key = o.msg_key AND p.sent_at IS NULL AND p.id < o.id))
ORDER BY o.id
LIMIT ?
FOR UPDATE SKIP LOCKED;

-- name: outbox_mark
-- params: id
UPDATE idem_outbox SET sent_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
WHERE id = ? AND sent_at IS NULL;

-- name: outbox_sweep
-- params: retention_ms limit
DELETE FROM idem_outbox
WHERE sent_at IS NOT NULL AND sent_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) - ?
ORDER BY sent_at
LIMIT ?;

-- name: outbox_backlog
-- The pending messages, counted over the index idem_outbox_pending, the
-- creation of the oldest, and the database's now (unix milliseconds).
SELECT count(*), min(created_at), (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
FROM idem_outbox
WHERE sent_at IS NULL;

-- Statements of InboxStore (package inbox), on idem_inbox (migration
-- "inbox"). A claim is inbox_insert for a new message (one statement);
-- for a known one, inbox_lock reads the row under a row lock and
-- inbox_update writes what InboxStore decided, in one transaction (the
-- caller's, for ClaimTx).

-- name: inbox_insert
-- params: message_id group status lease_ms
-- The insert id tells: the database's now (LAST_INSERT_ID(expr) in the
-- values) for a new record; 0 when the record exists, set by the update
-- clause, which changes nothing (fence + 0) but takes the row lock at
-- once (a plain INSERT's duplicate-key error would take a shared lock,
-- and two of them a deadlock at inbox_lock). Affected rows cannot tell:
-- under CLIENT_FOUND_ROWS the unchanged row counts as 1.
INSERT INTO idem_inbox (message_id, consumer_group, status, attempts, fence, lease_until, created_at, updated_at, last_error)
VALUES (?, ?, ?, 1, 1, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ?, LAST_INSERT_ID((TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)), (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000), X'')
ON DUPLICATE KEY UPDATE fence = fence + LAST_INSERT_ID(0);

-- name: inbox_lock
-- params: message_id group
SELECT status, attempts, fence, lease_until, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
FROM idem_inbox WHERE message_id = ? AND consumer_group = ?
FOR UPDATE;

-- name: inbox_update
-- params: status attempts fence lease_until at message_id group
UPDATE idem_inbox SET status = ?, attempts = ?, fence = ?, lease_until = ?, updated_at = ?
WHERE message_id = ? AND consumer_group = ?;

-- name: inbox_finish
-- params: message_id group fence
UPDATE idem_inbox SET status = 'succeeded', updated_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
WHERE message_id = ? AND consumer_group = ? AND status = 'processing' AND fence = ?;

-- name: inbox_fail
-- params: max_attempts reason message_id group fence
-- Ends the attempt of fence: failed, or dead after max_attempts. The
-- insert id says which (1 failed, 2 dead; LAST_INSERT_ID(expr) reads
-- attempts, which no assignment changes); no affected row: fenced out.
UPDATE idem_inbox SET
    status      = IF(LAST_INSERT_ID(IF(attempts >= ?, 2, 1)) = 2, 'dead', 'failed'),
    last_error  = ?,
    lease_until = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000),
    updated_at  = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
WHERE message_id = ? AND consumer_group = ? AND status = 'processing' AND fence = ?;

-- name: inbox_extend
-- params: lease_ms message_id group fence
-- The match is reported as the insert id (the new lease_until), since an
-- extension to the same millisecond changes no row.
UPDATE idem_inbox SET lease_until = LAST_INSERT_ID((TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ?)
WHERE message_id = ? AND consumer_group = ? AND status = 'processing' AND fence = ?
  AND lease_until > (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000);

-- name: inbox_get
-- params: message_id group
SELECT status, attempts, fence, lease_until, last_error, created_at, updated_at
FROM idem_inbox WHERE message_id = ? AND consumer_group = ?;

-- name: inbox_sweep
-- params: retention_ms retention_ms limit
-- Succeeded, failed and dead records last updated more than retention_ms
-- ago, and processing ones whose lease ended more than retention_ms ago
-- (claimed, so last updated, before that). The list of every status lets
-- the index idem_inbox_finished (status, updated_at) serve: a range of
-- updated_at under each status.
DELETE FROM idem_inbox
WHERE status IN ('dead', 'failed', 'processing', 'succeeded')
  AND updated_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) - ?
  AND (status <> 'processing' OR lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) - ?)
LIMIT ?;

-- name: inbox_list
-- params: status limit
-- InboxStore.List: the records of one status, least recently updated
-- first. An operator's read (the operator page): it scans the rows of
-- every status in updated_at's order and keeps those of status.
SELECT message_id, consumer_group, status, attempts, fence, lease_until, last_error, created_at, updated_at
FROM idem_inbox WHERE status = ?
ORDER BY updated_at, consumer_group, message_id
LIMIT ?;

-- name: inbox_revive
-- params: message_id group
-- InboxStore.Revive: a dead record becomes failed with no attempt
-- counted, so that its next delivery claims it (fence + 1) and runs the
-- handler again, up to max_attempts more times. Only a dead record.
UPDATE idem_inbox SET status = 'failed', attempts = 0, lease_until = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000), updated_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
WHERE message_id = ? AND consumer_group = ? AND status = 'dead';

-- Package steps' journal (StepJournal, steps.go): idem_ops and
-- idem_steps. Every statement but steps_fence runs in a transaction
-- after steps_fence when it writes for an execution. Scope, fingerprint,
-- input and reason are bound as COALESCE(?, X''), and the empty
-- last_error written as X'' (see the top of this file:
-- EMPTY_STRING_IS_NULL).

-- name: steps_fence
-- params: scope key owner fence
-- The record's status, under a row lock (on SQLite, the write
-- transaction's lock), if the lease (owner, fence) holds it: every write
-- of StepJournal for an execution runs it first in its transaction, so
-- that a takeover waits for the transaction or has happened already.
SELECT status FROM idem_records
WHERE scope = COALESCE(?, X'') AND idempotency_key = ? AND owner = ? AND fence = ? FOR UPDATE;

-- name: steps_op_lock
-- params: scope key
-- The operation, under a row lock, in Begin, Fail, Settle and Retry.
SELECT name, fingerprint, status, attempts FROM idem_ops
WHERE scope = COALESCE(?, X'') AND idempotency_key = ? FOR UPDATE;

-- name: steps_op_insert
-- params: scope key name fingerprint input delay_ms
-- A new operation, running its first attempt.
INSERT INTO idem_ops (scope, idempotency_key, name, fingerprint, input, status, attempts, next_at, last_error, created_at, updated_at, expires_at)
VALUES (COALESCE(?, X''), ?, ?, COALESCE(?, X''), COALESCE(?, X''), 'running', 1, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ?, X'', (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000), (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000), 0);

-- name: steps_op_begin
-- params: name fingerprint input attempts delay_ms scope key
-- An attempt begins: the operation runs (as it is, or replaced by
-- another under the key), with attempts counted by StepJournal.Begin.
UPDATE idem_ops SET name = ?, fingerprint = COALESCE(?, X''), input = COALESCE(?, X''), status = 'running',
    attempts = ?, next_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ?, last_error = X'', updated_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000), expires_at = 0
WHERE scope = COALESCE(?, X'') AND idempotency_key = ?;

-- name: steps_drop
-- params: scope key
-- Drops the operation's checkpoints.
DELETE FROM idem_steps WHERE scope = COALESCE(?, X'') AND idempotency_key = ?;

-- name: steps_checkpoints
-- params: scope key
-- The operation's checkpoints, in the order they were saved.
SELECT step, result, created_at FROM idem_steps
WHERE scope = COALESCE(?, X'') AND idempotency_key = ?
ORDER BY id;

-- name: steps_save
-- params: scope key step result
-- A checkpoint; no row if the step has one already. INSERT IGNORE, not
-- ON DUPLICATE KEY UPDATE step = step: under the DSN's clientFoundRows,
-- an upsert that changes nothing counts one affected row, as an insert
-- does, and a step saved already would pass for a new checkpoint (a
-- local step's writes committing twice). Every value it binds is
-- checked before (a step name of 1-255 bytes), so IGNORE hides no
-- other error.
INSERT IGNORE INTO idem_steps (scope, idempotency_key, step, result, created_at)
VALUES (COALESCE(?, X''), ?, ?, ?, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000));

-- name: steps_fail
-- params: max_attempts max_attempts delay_ms reason scope key
-- Ends a running attempt: waiting until delay_ms from now, or dead
-- after max_attempts.
UPDATE idem_ops SET
    status = CASE WHEN attempts >= ? THEN 'dead' ELSE 'waiting' END,
    next_at = CASE WHEN attempts >= ? THEN 0 ELSE (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ? END,
    last_error = COALESCE(?, X''), updated_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
WHERE scope = COALESCE(?, X'') AND idempotency_key = ? AND status = 'running';

-- name: steps_finish
-- params: retention_ms scope key
-- The operation is done (its record completed), kept for retention_ms.
UPDATE idem_ops SET status = 'done', next_at = 0, last_error = X'', updated_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000), expires_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ?
WHERE scope = COALESCE(?, X'') AND idempotency_key = ? AND status <> 'done';

-- name: steps_settle_done
-- params: retention_ms scope key fingerprint
-- The completer found the record completed: done, if the operation
-- is the record's (its fingerprint) and not done.
UPDATE idem_ops SET status = 'done', next_at = 0, last_error = X'', updated_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000), expires_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ?
WHERE scope = COALESCE(?, X'') AND idempotency_key = ? AND fingerprint = COALESCE(?, X'') AND status <> 'done';

-- name: steps_settle_dead
-- params: reason scope key fingerprint status attempts
-- The completer cannot resume the operation: dead, with the reason, if
-- it is still as the completer read it (status, attempts).
UPDATE idem_ops SET status = 'dead', next_at = 0, last_error = COALESCE(?, X''), updated_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
WHERE scope = COALESCE(?, X'') AND idempotency_key = ? AND fingerprint = COALESCE(?, X'') AND status <> 'done' AND status = ? AND attempts = ?;

-- name: steps_due
-- params: name limit
-- Operations of one name the completer may take up, earliest first.
SELECT scope, idempotency_key, name, fingerprint, input, status, attempts, next_at, last_error, created_at, updated_at, expires_at FROM idem_ops
WHERE name = ? AND status IN ('running', 'waiting') AND next_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
ORDER BY next_at
LIMIT ?;

-- name: steps_postpone
-- params: delay_ms scope key
-- Moves a running or waiting operation's next_at.
UPDATE idem_ops SET next_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ?
WHERE scope = COALESCE(?, X'') AND idempotency_key = ? AND status IN ('running', 'waiting');

-- name: steps_get
-- params: scope key
-- One operation.
SELECT scope, idempotency_key, name, fingerprint, input, status, attempts, next_at, last_error, created_at, updated_at, expires_at FROM idem_ops
WHERE scope = COALESCE(?, X'') AND idempotency_key = ?;

-- name: steps_list
-- params: status limit
-- The operations of one status, least recently updated first: an
-- operator's read, which no index serves.
SELECT scope, idempotency_key, name, fingerprint, input, status, attempts, next_at, last_error, created_at, updated_at, expires_at FROM idem_ops
WHERE status = ?
ORDER BY updated_at, scope, idempotency_key
LIMIT ?;

-- name: steps_retry
-- params: scope key
-- A dead operation (its attempts from 0 again) or a waiting one
-- becomes due now. attempts is set before status: MySQL assigns in order.
UPDATE idem_ops SET attempts = CASE WHEN status = 'dead' THEN 0 ELSE attempts END,
    status = 'waiting', next_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000), updated_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
WHERE scope = COALESCE(?, X'') AND idempotency_key = ? AND status IN ('dead', 'waiting');

-- name: steps_sweep
-- params: limit
-- Deletes up to limit done operations whose retention ended.
DELETE FROM idem_ops
WHERE status = 'done' AND expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
ORDER BY expires_at
LIMIT ?;
