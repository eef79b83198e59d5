-- Statements of the SQLite dialect.
--
-- Each statement starts with "-- name: NAME" and lists the parameters it
-- binds, in order, on a "-- params:" line; ?1, ?2, … refer to that list.
-- Times are INTEGER unix milliseconds; "now" is always the database's
-- clock, CAST(unixepoch('subsec') * 1000 AS INTEGER), which SQLite holds
-- still for the whole of one statement.

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS idem_schema_migrations (
    version    INTEGER NOT NULL PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at INTEGER NOT NULL
) STRICT;

-- name: lock_schema
-- Nothing to do: Migrate runs in a BEGIN IMMEDIATE transaction, which
-- already holds the database's write lock.

-- name: select_migrations
SELECT version FROM idem_schema_migrations ORDER BY version;

-- name: insert_migration
-- params: version name
INSERT INTO idem_schema_migrations (version, name, applied_at)
VALUES (?1, ?2, CAST(unixepoch('subsec') * 1000 AS INTEGER));

-- name: acquire
-- params: scope key fingerprint owner lease_ms retention_ms
-- Inserts a new record, or, in one statement, replaces a record past its
-- expiry (whatever its status and fingerprint) or takes over a processing
-- record with the same fingerprint whose lease has ended. It returns no
-- row when the record found is none of these; the caller then reads it.
-- A takeover (of a record that has not expired) keeps created_at: the
-- record goes on. A replaced expired record is a new record, created now.
-- took_over (migration 2) says that the record replaced was processing.
INSERT INTO idem_records AS r (
    scope, idempotency_key, fingerprint, status, owner, fence,
    lease_until, retention_ms, created_at, expires_at)
VALUES (
    ?1, ?2, ?3, 'processing', ?4, 1,
    CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?5,
    ?6,
    CAST(unixepoch('subsec') * 1000 AS INTEGER),
    CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?5 + ?6)
ON CONFLICT (scope, idempotency_key) DO UPDATE SET
    fingerprint     = excluded.fingerprint,
    status          = 'processing',
    owner           = excluded.owner,
    fence           = r.fence + 1,
    lease_until     = excluded.lease_until,
    retention_ms    = excluded.retention_ms,
    response_status = NULL,
    response_header = NULL,
    response_body   = NULL,
    body_omitted    = 0,
    created_at      = CASE WHEN r.expires_at > excluded.created_at THEN r.created_at ELSE excluded.created_at END,
    completed_at    = NULL,
    expires_at      = excluded.expires_at,
    took_over       = (r.status = 'processing')
WHERE r.expires_at <= excluded.created_at
   OR (r.status = 'processing' AND r.fingerprint = excluded.fingerprint
       AND r.lease_until <= excluded.created_at)
RETURNING fence, lease_until, created_at, took_over;

-- name: select_record
-- params: scope key
SELECT scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM idem_records
WHERE scope = ?1 AND idempotency_key = ?2;

-- name: select_record_in_tx
-- Not used: select_record run in the caller's transaction, which holds
-- the write lock, sees what its completion saw.

-- name: select_held
-- params: scope key fingerprint
-- The record, if Acquire cannot take it: live and completed, live and
-- processing under a lease that has not ended, or bound to another
-- fingerprint. Acquire reads it first, so that a replay or a duplicate
-- costs a read and no write transaction.
SELECT scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM idem_records
WHERE scope = ?1 AND idempotency_key = ?2
  AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER)
  AND (status = 'completed' OR fingerprint <> ?3
       OR lease_until > CAST(unixepoch('subsec') * 1000 AS INTEGER));

-- name: complete
-- params: scope key owner fence response_status response_header response_body body_omitted retention_ms
-- It returns the record's other columns, so that Store.CompleteRecord
-- needs no read; no row means the lease is lost.
UPDATE idem_records SET
    status          = 'completed',
    response_status = ?5,
    response_header = ?6,
    response_body   = ?7,
    body_omitted    = ?8,
    retention_ms    = ?9,
    completed_at    = CAST(unixepoch('subsec') * 1000 AS INTEGER),
    expires_at      = CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?9
WHERE scope = ?1 AND idempotency_key = ?2
  AND status = 'processing' AND owner = ?3 AND fence = ?4
RETURNING fingerprint, lease_until, created_at, completed_at, expires_at;

-- name: extend
-- params: scope key owner fence lease_ms
UPDATE idem_records SET
    lease_until = CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?5,
    expires_at  = CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?5 + retention_ms
WHERE scope = ?1 AND idempotency_key = ?2
  AND status = 'processing' AND owner = ?3 AND fence = ?4
RETURNING lease_until;

-- name: select_lease
-- Not used: extend returns lease_until.

-- name: release
-- params: scope key owner fence
DELETE FROM idem_records
WHERE scope = ?1 AND idempotency_key = ?2
  AND status = 'processing' AND owner = ?3 AND fence = ?4;

-- name: delete
-- params: scope key
DELETE FROM idem_records WHERE scope = ?1 AND idempotency_key = ?2;

-- name: delete_if
-- params: scope key owner fence
-- Store.DeleteIf: no row affected means the record is gone or another's;
-- select_record then tells which.
DELETE FROM idem_records
WHERE scope = ?1 AND idempotency_key = ?2 AND owner = ?3 AND fence = ?4;

-- name: sweep
-- params: limit
-- The inner query walks idem_records_expires_at. The status test is
-- redundant (a processing record expires retention after its lease ends)
-- and keeps a live lease safe whatever expires_at says.
DELETE FROM idem_records WHERE rowid IN (
    SELECT rowid FROM idem_records
    WHERE expires_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER)
      AND (status = 'completed'
           OR lease_until <= CAST(unixepoch('subsec') * 1000 AS INTEGER))
    LIMIT ?1);

-- name: list
-- params: limit
-- Store.List: the oldest records first. An operator's read (idem
-- inspect): it scans the table and sorts, which no index serves.
SELECT scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM idem_records
ORDER BY created_at, scope, idempotency_key
LIMIT ?1;

-- name: list_status
-- params: status limit
SELECT scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM idem_records
WHERE status = ?1
ORDER BY created_at, scope, idempotency_key
LIMIT ?2;

-- Tokens (package token; TokenStore). idem_tokens comes with migration 3.

-- name: token_insert
-- params: digest scope ttl_ms
-- No row: the digest is stored already (token.ErrDuplicate).
INSERT INTO idem_tokens (digest, scope, created_at, expires_at)
VALUES (?1, ?2,
        CAST(unixepoch('subsec') * 1000 AS INTEGER),
        CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?3)
ON CONFLICT (digest) DO NOTHING
RETURNING expires_at;

-- name: token_consume
-- params: digest scope result token_fingerprint keep_ms
-- Spends the live, unused token of the scope — used_at, result and
-- fingerprint set, expires_at moved to now + keep_ms if that is later —
-- and returns its used_at. No row: used, or no live token of the scope;
-- token_select tells which. SQLite runs one writer at a time, so nothing
-- can come between the two but another writer's commit, after which the
-- token is used for good.
UPDATE idem_tokens SET
    used_at     = CAST(unixepoch('subsec') * 1000 AS INTEGER),
    result      = ?3,
    fingerprint = ?4,
    expires_at  = MAX(expires_at, CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?5)
WHERE digest = ?1 AND scope = ?2 AND used_at IS NULL
  AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER)
RETURNING used_at;

-- name: token_select
-- params: digest scope
-- The live token of the scope: used_at (NULL if unused), result and
-- fingerprint.
SELECT used_at, result, fingerprint FROM idem_tokens
WHERE digest = ?1 AND scope = ?2
  AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER);

-- name: token_trim
-- params: scope keep
-- Deletes the scope's unused tokens but its keep newest (by expires_at,
-- then digest; expired ones come last), walking
-- idem_tokens_scope_expires_at. SQLite runs one writer at a time.
DELETE FROM idem_tokens WHERE rowid IN (
    SELECT rowid FROM idem_tokens
    WHERE scope = ?1 AND used_at IS NULL
    ORDER BY expires_at DESC, digest DESC
    LIMIT -1 OFFSET ?2);

-- name: token_trim_delete
-- Unused: token_trim deletes in one statement (MySQL's needs two).

-- name: token_sweep
-- params: limit
-- Deletes up to limit expired tokens, used or not.
DELETE FROM idem_tokens WHERE rowid IN (
    SELECT rowid FROM idem_tokens
    WHERE expires_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER)
    LIMIT ?1);

-- Statements of LockBackend (package lock), on idem_locks (migration
-- "locks"). lease_ms is the TTL in whole milliseconds rounded up, plus
-- one for the truncation of "now" to the millisecond: the lease never
-- ends before the TTL has passed since the statement began.

-- name: lock_acquire
-- params: name owner lease_ms
-- Inserts the name's row, or takes it, fence + 1, if it is free (no
-- owner) or its lease has ended. No row: held by another.
INSERT INTO idem_locks AS l (name, owner, fence, lease_until)
VALUES (?1, ?2, 1, CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?3)
ON CONFLICT (name) DO UPDATE SET
    owner       = excluded.owner,
    fence       = l.fence + 1,
    lease_until = excluded.lease_until
WHERE l.owner = '' OR l.lease_until <= CAST(unixepoch('subsec') * 1000 AS INTEGER)
RETURNING fence;

-- name: lock_extend
-- params: name owner fence lease_ms
UPDATE idem_locks
SET lease_until = CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?4
WHERE name = ?1 AND owner = ?2 AND fence = ?3
  AND lease_until > CAST(unixepoch('subsec') * 1000 AS INTEGER);

-- name: lock_release
-- params: name owner fence
UPDATE idem_locks
SET owner = '', lease_until = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE name = ?1 AND owner = ?2 AND fence = ?3
  AND lease_until > CAST(unixepoch('subsec') * 1000 AS INTEGER);

-- Outbox (OutboxStore, outbox.go): statements whose names start with
-- "outbox_".

-- name: outbox_insert
-- params: message_id topic msg_key payload headers
-- msg_id is the message's ID, made by OutboxStore.Add (outbox.NewID).
INSERT INTO idem_outbox (msg_id, topic, msg_key, payload, headers, created_at)
VALUES (?1, ?2, ?3, ?4, ?5, CAST(unixepoch('subsec') * 1000 AS INTEGER));

-- name: outbox_claim
-- params: limit
-- The pending heads (see queries/postgres.sql). SQLite has no row locks:
-- the claimer holds the relay lease (idem_locks, name idem_outbox), and
-- outbox_mark checks it.
SELECT o.id, o.msg_id, o.topic, o.msg_key, o.payload, o.headers, o.created_at
FROM idem_outbox o
WHERE o.sent_at IS NULL
  AND (o.msg_key = '' OR NOT EXISTS (
      SELECT 1 FROM idem_outbox p
      WHERE p.msg_key = o.msg_key AND p.sent_at IS NULL AND p.id < o.id))
ORDER BY o.id
LIMIT ?1;

-- name: outbox_mark
-- params: id name owner fence
-- Marks the message only while the caller's lease on the relay lock
-- (name, owner, fence) lives: 0 rows when it ended.
UPDATE idem_outbox SET sent_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE id = ?1 AND sent_at IS NULL
  AND EXISTS (SELECT 1 FROM idem_locks
              WHERE name = ?2 AND owner = ?3 AND fence = ?4
                AND lease_until > CAST(unixepoch('subsec') * 1000 AS INTEGER));

-- name: outbox_sweep
-- params: retention_ms limit
DELETE FROM idem_outbox WHERE id IN (
    SELECT id FROM idem_outbox
    WHERE sent_at IS NOT NULL AND sent_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER) - ?1
    ORDER BY sent_at
    LIMIT ?2);

-- name: outbox_backlog
-- The pending messages, counted over the partial index idem_outbox_pending, the
-- creation of the oldest, and the database's now (unix milliseconds).
SELECT count(*), min(created_at), CAST(unixepoch('subsec') * 1000 AS INTEGER)
FROM idem_outbox
WHERE sent_at IS NULL;

-- Statements of InboxStore (package inbox), on idem_inbox (migration
-- "inbox"). A claim is inbox_insert for a new message (one statement);
-- for a known one, inbox_lock reads the row and inbox_update writes what
-- InboxStore decided, in one write transaction (the caller's, for
-- ClaimTx), which holds the database's write lock.

-- name: inbox_insert
-- params: message_id group lease_ms status
INSERT INTO idem_inbox (message_id, consumer_group, status, attempts, fence, lease_until, created_at, updated_at)
VALUES (?1, ?2, ?4, 1, 1, CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?3, CAST(unixepoch('subsec') * 1000 AS INTEGER), CAST(unixepoch('subsec') * 1000 AS INTEGER))
ON CONFLICT (message_id, consumer_group) DO NOTHING
RETURNING created_at;

-- name: inbox_lock
-- params: message_id group
SELECT status, attempts, fence, lease_until, CAST(unixepoch('subsec') * 1000 AS INTEGER)
FROM idem_inbox WHERE message_id = ?1 AND consumer_group = ?2;

-- name: inbox_update
-- params: message_id group status attempts fence lease_until at
UPDATE idem_inbox SET status = ?3, attempts = ?4, fence = ?5, lease_until = ?6, updated_at = ?7
WHERE message_id = ?1 AND consumer_group = ?2;

-- name: inbox_finish
-- params: message_id group fence
UPDATE idem_inbox SET status = 'succeeded', updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE message_id = ?1 AND consumer_group = ?2 AND status = 'processing' AND fence = ?3;

-- name: inbox_fail
-- params: message_id group fence max_attempts reason
UPDATE idem_inbox SET
    status      = CASE WHEN attempts >= ?4 THEN 'dead' ELSE 'failed' END,
    last_error  = ?5,
    lease_until = CAST(unixepoch('subsec') * 1000 AS INTEGER),
    updated_at  = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE message_id = ?1 AND consumer_group = ?2 AND status = 'processing' AND fence = ?3
RETURNING status;

-- name: inbox_extend
-- params: message_id group fence lease_ms
UPDATE idem_inbox SET lease_until = CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?4
WHERE message_id = ?1 AND consumer_group = ?2 AND status = 'processing' AND fence = ?3
  AND lease_until > CAST(unixepoch('subsec') * 1000 AS INTEGER);

-- name: inbox_get
-- params: message_id group
SELECT status, attempts, fence, lease_until, last_error, created_at, updated_at
FROM idem_inbox WHERE message_id = ?1 AND consumer_group = ?2;

-- name: inbox_sweep
-- params: retention_ms limit
-- Succeeded, failed and dead records last updated more than retention_ms
-- ago, and processing ones whose lease ended more than retention_ms ago
-- (claimed, so last updated, before that): a range of idem_inbox_updated.
DELETE FROM idem_inbox WHERE rowid IN (
    SELECT rowid FROM idem_inbox
    WHERE updated_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER) - ?1
      AND (status <> 'processing' OR lease_until <= CAST(unixepoch('subsec') * 1000 AS INTEGER) - ?1)
    LIMIT ?2);

-- name: inbox_list
-- params: status limit
-- InboxStore.List: the records of one status, least recently updated
-- first. An operator's read (the operator page): it scans the rows of
-- every status in updated_at's order and keeps those of status.
SELECT message_id, consumer_group, status, attempts, fence, lease_until, last_error, created_at, updated_at
FROM idem_inbox WHERE status = ?1
ORDER BY updated_at, consumer_group, message_id
LIMIT ?2;

-- name: inbox_revive
-- params: message_id group
-- InboxStore.Revive: a dead record becomes failed with no attempt
-- counted, so that its next delivery claims it (fence + 1) and runs the
-- handler again, up to max_attempts more times. Only a dead record.
UPDATE idem_inbox SET status = 'failed', attempts = 0, lease_until = CAST(unixepoch('subsec') * 1000 AS INTEGER), updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE message_id = ?1 AND consumer_group = ?2 AND status = 'dead';

-- Package steps' journal (StepJournal, steps.go): idem_ops and
-- idem_steps. Every statement but steps_fence runs in a transaction
-- after steps_fence when it writes for an execution.

-- name: steps_fence
-- params: scope key owner fence
-- The record's status, under a row lock (on SQLite, the write
-- transaction's lock), if the lease (owner, fence) holds it: every write
-- of StepJournal for an execution runs it first in its transaction, so
-- that a takeover waits for the transaction or has happened already.
SELECT status FROM idem_records
WHERE scope = ?1 AND idempotency_key = ?2 AND owner = ?3 AND fence = ?4;

-- name: steps_op_lock
-- params: scope key
-- The operation, under a row lock, in Begin, Fail, Settle and Retry.
SELECT name, fingerprint, status, attempts FROM idem_ops
WHERE scope = ?1 AND idempotency_key = ?2;

-- name: steps_op_insert
-- params: scope key name fingerprint input delay_ms
-- A new operation, running its first attempt.
INSERT INTO idem_ops (scope, idempotency_key, name, fingerprint, input, status, attempts, next_at, last_error, created_at, updated_at, expires_at)
VALUES (?1, ?2, ?3, ?4, ?5, 'running', 1, CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?6, '', CAST(unixepoch('subsec') * 1000 AS INTEGER), CAST(unixepoch('subsec') * 1000 AS INTEGER), 0);

-- name: steps_op_begin
-- params: name fingerprint input attempts delay_ms scope key
-- An attempt begins: the operation runs (as it is, or replaced by
-- another under the key), with attempts counted by StepJournal.Begin.
UPDATE idem_ops SET name = ?1, fingerprint = ?2, input = ?3, status = 'running',
    attempts = ?4, next_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?5, last_error = '', updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER), expires_at = 0
WHERE scope = ?6 AND idempotency_key = ?7;

-- name: steps_drop
-- params: scope key
-- Drops the operation's checkpoints.
DELETE FROM idem_steps WHERE scope = ?1 AND idempotency_key = ?2;

-- name: steps_checkpoints
-- params: scope key
-- The operation's checkpoints, in the order they were saved.
SELECT step, result, created_at FROM idem_steps
WHERE scope = ?1 AND idempotency_key = ?2
ORDER BY rowid;

-- name: steps_save
-- params: scope key step result
-- A checkpoint; no row if the step has one already.
INSERT INTO idem_steps (scope, idempotency_key, step, result, created_at)
VALUES (?1, ?2, ?3, ?4, CAST(unixepoch('subsec') * 1000 AS INTEGER))
ON CONFLICT (scope, idempotency_key, step) DO NOTHING;

-- name: steps_fail
-- params: max_attempts delay_ms reason scope key
-- Ends a running attempt: waiting until delay_ms from now, or dead
-- after max_attempts.
UPDATE idem_ops SET
    status = CASE WHEN attempts >= ?1 THEN 'dead' ELSE 'waiting' END,
    next_at = CASE WHEN attempts >= ?1 THEN 0 ELSE CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?2 END,
    last_error = ?3, updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE scope = ?4 AND idempotency_key = ?5 AND status = 'running';

-- name: steps_finish
-- params: retention_ms scope key
-- The operation is done (its record completed), kept for retention_ms.
UPDATE idem_ops SET status = 'done', next_at = 0, last_error = '', updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER), expires_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?1
WHERE scope = ?2 AND idempotency_key = ?3 AND status <> 'done';

-- name: steps_settle_done
-- params: retention_ms scope key fingerprint
-- The completer found the record completed: done, if the operation
-- is the record's (its fingerprint) and not done.
UPDATE idem_ops SET status = 'done', next_at = 0, last_error = '', updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER), expires_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?1
WHERE scope = ?2 AND idempotency_key = ?3 AND fingerprint = ?4 AND status <> 'done';

-- name: steps_settle_dead
-- params: reason scope key fingerprint status attempts
-- The completer cannot resume the operation: dead, with the reason, if
-- it is still as the completer read it (status, attempts).
UPDATE idem_ops SET status = 'dead', next_at = 0, last_error = ?1, updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE scope = ?2 AND idempotency_key = ?3 AND fingerprint = ?4 AND status <> 'done' AND status = ?5 AND attempts = ?6;

-- name: steps_due
-- params: name limit
-- Operations of one name the completer may take up, earliest first.
SELECT scope, idempotency_key, name, fingerprint, input, status, attempts, next_at, last_error, created_at, updated_at, expires_at FROM idem_ops
WHERE name = ?1 AND status IN ('running', 'waiting') AND next_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER)
ORDER BY next_at
LIMIT ?2;

-- name: steps_postpone
-- params: delay_ms scope key
-- Moves a running or waiting operation's next_at.
UPDATE idem_ops SET next_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?1
WHERE scope = ?2 AND idempotency_key = ?3 AND status IN ('running', 'waiting');

-- name: steps_get
-- params: scope key
-- One operation.
SELECT scope, idempotency_key, name, fingerprint, input, status, attempts, next_at, last_error, created_at, updated_at, expires_at FROM idem_ops
WHERE scope = ?1 AND idempotency_key = ?2;

-- name: steps_list
-- params: status limit
-- The operations of one status, least recently updated first: an
-- operator's read, which no index serves.
SELECT scope, idempotency_key, name, fingerprint, input, status, attempts, next_at, last_error, created_at, updated_at, expires_at FROM idem_ops
WHERE status = ?1
ORDER BY updated_at, scope, idempotency_key
LIMIT ?2;

-- name: steps_retry
-- params: scope key
-- A dead operation (its attempts from 0 again) or a waiting one
-- becomes due now. attempts is set before status: MySQL assigns in order.
UPDATE idem_ops SET attempts = CASE WHEN status = 'dead' THEN 0 ELSE attempts END,
    status = 'waiting', next_at = CAST(unixepoch('subsec') * 1000 AS INTEGER), updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE scope = ?1 AND idempotency_key = ?2 AND status IN ('dead', 'waiting');

-- name: steps_sweep
-- params: limit
-- Deletes up to limit done operations whose retention ended.
DELETE FROM idem_ops WHERE rowid IN (
    SELECT rowid FROM idem_ops
    WHERE status = 'done' AND expires_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER)
    ORDER BY expires_at
    LIMIT ?1);
