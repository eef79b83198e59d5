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
-- The whole of Acquire in one statement. It returns took_over and then
-- the record's columns. held is the record if Acquire cannot take it
-- (live and completed, processing under a live lease, or bound to
-- another fingerprint), read from the statement's snapshot without a
-- lock, with its lease as renewed (idem_records_renewed, migration 3),
-- once: the CTE, read twice, is materialised. A replay or a duplicate
-- costs this read and nothing else (no row is locked, no transaction id
-- is assigned, nothing is written or flushed, and idem_acquire_write is
-- never called). Otherwise idem_acquire_write (migrations 2, 3 and 9)
-- inserts a new record, or returns the record there as it is now if
-- another owner holds it (read without a lock), or else locks it and
-- replaces it if it has expired, or takes it over if it is processing
-- with the same fingerprint and its lease has ended, or returns it as it
-- is then: another owner's. The record is ours if and only if its owner is the
-- owner we passed. No row means the record met vanished in between: the
-- caller runs the statement again.
WITH held AS (
    SELECT took_over, scope, idempotency_key, fingerprint, status, owner, fence,
           lease_until, retention_ms, response_status, response_header,
           response_body, body_omitted, created_at, completed_at, expires_at
    FROM idem_records_renewed
    WHERE scope = $1 AND idempotency_key = $2
      AND expires_at > floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
      AND (status = 'completed' OR fingerprint <> $3 OR lease_until > floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint))
SELECT took_over, scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM held
UNION ALL
SELECT took_over, scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM idem_acquire_write($1::text, $2::text, $3::text, $4::text, $5::bigint, $6::bigint)
WHERE NOT EXISTS (SELECT 1 FROM held);

-- name: select_record
-- params: scope key
-- The record, with a processing record's lease and expiry as renewed.
SELECT scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM idem_records_renewed
WHERE scope = $1 AND idempotency_key = $2;

-- name: select_record_in_tx
-- Not used: select_record run in the caller's transaction sees what its
-- completion saw (they share the transaction's snapshot under REPEATABLE
-- READ and SERIALIZABLE; a newer version of the row would have failed
-- the completion with 40001).

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
-- Writes the renewal, not the record: a business transaction that has
-- read or will complete the record (CompleteTx) under REPEATABLE READ or
-- SERIALIZABLE must not meet an update it did not see (40001). The
-- record is checked under a share lock, which makes the renewal wait for
-- a takeover, a completion or a sweep holding the row, and then see the
-- row as they left it (no row: the lease is lost), and makes them wait
-- for the renewal. The renewal replaces the key's previous one, whoever
-- wrote it.
WITH held AS (
    SELECT retention_ms FROM idem_records
    WHERE scope = $1 AND idempotency_key = $2
      AND status = 'processing' AND owner = $3 AND fence = $4
    FOR SHARE)
INSERT INTO idem_renewals AS n (scope, idempotency_key, owner, fence, lease_until, expires_at)
SELECT $1, $2, $3, $4,
       floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint + $5,
       floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint + $5 + retention_ms
FROM held
ON CONFLICT (scope, idempotency_key) DO UPDATE SET
    owner       = excluded.owner,
    fence       = excluded.fence,
    lease_until = excluded.lease_until,
    expires_at  = excluded.expires_at
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

-- name: delete_if
-- params: scope key owner fence
-- Store.DeleteIf: deletes the record if it still has the owner and fence
-- given, and returns whether it did with the owner and fence of the record
-- the statement's snapshot shows (NULL: none). A record that the snapshot
-- shows with that owner and fence but that the DELETE did not remove was
-- changed or removed after the snapshot (the DELETE waited for it and
-- found it so): Store.DeleteIf runs the statement again.
WITH gone AS (
    DELETE FROM idem_records
    WHERE scope = $1 AND idempotency_key = $2 AND owner = $3 AND fence = $4
    RETURNING 1)
SELECT (SELECT count(*) FROM gone), r.owner, r.fence
FROM (SELECT 1) AS one
LEFT JOIN idem_records AS r ON r.scope = $1 AND r.idempotency_key = $2;

-- name: sweep
-- params: limit
-- Run in a READ COMMITTED transaction (see idem_sweep, migration 3): it
-- locks the expired records it finds (SKIP LOCKED leaves rows another
-- transaction holds, a CompleteTx in progress or a concurrent sweep, to
-- a later sweep), then deletes those that are still expired as they are
-- now, with their renewals, and lapsed renewals no record holds. It
-- returns the number of records removed.
SELECT idem_sweep($1);

-- name: list
-- params: limit
-- Store.List: the oldest records first. An operator's read (idem
-- inspect): it scans the table and sorts, which no index serves.
-- The records with the lease as renewed (see select_record).
SELECT scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM idem_records_renewed
ORDER BY created_at, scope, idempotency_key
LIMIT $1;

-- name: list_status
-- params: status limit
SELECT scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM idem_records_renewed
WHERE status = $1
ORDER BY created_at, scope, idempotency_key
LIMIT $2;

-- Tokens (package token; TokenStore). idem_tokens comes with migration 4.

-- name: token_insert
-- params: digest scope ttl_ms
-- No row: the digest is stored already (token.ErrDuplicate).
INSERT INTO idem_tokens (digest, scope, created_at, expires_at)
VALUES ($1, $2,
        floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint,
        floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint + $3)
ON CONFLICT (digest) DO NOTHING
RETURNING expires_at;

-- name: token_consume
-- params: digest scope result token_fingerprint keep_ms
-- Spends the live, unused token of the scope — used_at, result and
-- fingerprint set, expires_at moved to now + keep_ms if that is later —
-- and returns (true, its used_at, NULL, NULL). Otherwise it returns the
-- token as the statement's snapshot shows it, if it is live and of the
-- scope: (false, used_at, result, fingerprint) — used — or (false, NULL,
-- NULL, NULL) when the snapshot shows it unused although the UPDATE did
-- not spend it: a concurrent Consume spent it after the snapshot was
-- taken (the UPDATE waited for its row lock and found it used);
-- token_select, a new statement and so a new snapshot under READ
-- COMMITTED, then reads what it left. No row: no live token of the scope
-- (token.ErrInvalid). A token of another scope is not touched.
WITH spent AS (
    UPDATE idem_tokens SET
        used_at     = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint,
        result      = $3,
        fingerprint = $4,
        expires_at  = GREATEST(expires_at, floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint + $5)
    WHERE digest = $1 AND scope = $2 AND used_at IS NULL
      AND expires_at > floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
    RETURNING used_at)
SELECT true, used_at, NULL::bytea, NULL::text FROM spent
UNION ALL
SELECT false, used_at, result, fingerprint FROM idem_tokens
WHERE digest = $1 AND scope = $2
  AND expires_at > floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
  AND NOT EXISTS (SELECT 1 FROM spent);

-- name: token_select
-- params: digest scope
-- The live token of the scope: used_at (NULL if unused), result and
-- fingerprint.
SELECT used_at, result, fingerprint FROM idem_tokens
WHERE digest = $1 AND scope = $2
  AND expires_at > floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint;

-- name: token_trim
-- params: scope keep
-- Deletes the scope's unused tokens but its keep newest (by expires_at,
-- then digest; expired ones come last), walking
-- idem_tokens_scope_expires_at. The outer used_at IS NULL is checked again
-- on a row that a concurrent Consume changed (READ COMMITTED rechecks the
-- DELETE's own conditions on the row's latest version): a token spent
-- meanwhile stays.
DELETE FROM idem_tokens
WHERE scope = $1 AND used_at IS NULL AND digest IN (
    SELECT digest FROM idem_tokens
    WHERE scope = $1 AND used_at IS NULL
    ORDER BY expires_at DESC, digest COLLATE "C" DESC
    OFFSET $2);

-- name: token_trim_delete
-- Unused: token_trim deletes in one statement (MySQL's needs two).

-- name: token_sweep
-- params: limit
-- Deletes up to limit expired tokens, used or not. SKIP LOCKED leaves a
-- row that a transaction holds (a ConsumeTx in progress, a concurrent
-- sweep) to a later sweep.
DELETE FROM idem_tokens WHERE digest IN (
    SELECT digest FROM idem_tokens
    WHERE expires_at <= floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
    LIMIT $1
    FOR UPDATE SKIP LOCKED);

-- Statements of LockBackend (package lock), on idem_locks (migration
-- "locks"). lease_ms is the TTL in whole milliseconds rounded up, plus
-- one for the truncation of "now" to the millisecond: the lease never
-- ends before the TTL has passed since the statement began.

-- name: lock_acquire
-- params: name owner lease_ms
-- Inserts the name's row, or takes it, fence + 1, if it is free (no
-- owner) or its lease has ended. ON CONFLICT DO UPDATE locks the row and
-- reads its latest version, so of two acquisitions racing on a free row
-- one takes it and the other finds it held. No row: held by another.
INSERT INTO idem_locks AS l (name, owner, fence, lease_until)
VALUES ($1, $2, 1, floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint + $3)
ON CONFLICT (name) DO UPDATE SET
    owner       = excluded.owner,
    fence       = l.fence + 1,
    lease_until = excluded.lease_until
WHERE l.owner = '' OR l.lease_until <= floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
RETURNING fence;

-- name: lock_extend
-- params: name owner fence lease_ms
-- Compare-and-extend: one row if the lease is still the caller's.
UPDATE idem_locks
SET lease_until = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint + $4
WHERE name = $1 AND owner = $2 AND fence = $3
  AND lease_until > floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint;

-- name: lock_release
-- params: name owner fence
-- Compare-and-delete: the row, and its fence, stay; the owner goes.
UPDATE idem_locks
SET owner = '', lease_until = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
WHERE name = $1 AND owner = $2 AND fence = $3
  AND lease_until > floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint;

-- Outbox (OutboxStore, outbox.go): statements whose names start with
-- "outbox_".

-- name: outbox_insert
-- params: message_id topic msg_key payload headers
-- msg_id is the message's ID, made by OutboxStore.Add (outbox.NewID).
INSERT INTO idem_outbox (msg_id, topic, msg_key, payload, headers, created_at)
VALUES ($1, $2, $3, $4, $5, floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint);

-- name: outbox_claim
-- params: limit
-- The pending heads: messages with no older pending message of their key
-- (every message without a key), oldest first, that no other batch
-- holds (SKIP LOCKED). The batch's transaction holds them until it marks
-- them or ends. A head that another batch holds keeps its key's later
-- messages out too: they have an older pending message.
SELECT o.id, o.msg_id, o.topic, o.msg_key, o.payload, o.headers, o.created_at
FROM idem_outbox o
WHERE o.sent_at IS NULL
  AND (o.msg_key = '' OR NOT EXISTS (
      SELECT 1 FROM idem_outbox p
      WHERE p.msg_key = o.msg_key AND p.sent_at IS NULL AND p.id < o.id))
ORDER BY o.id
LIMIT $1
FOR UPDATE OF o SKIP LOCKED;

-- name: outbox_mark
-- params: id
UPDATE idem_outbox SET sent_at = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
WHERE id = $1 AND sent_at IS NULL;

-- name: outbox_sweep
-- params: retention_ms limit
DELETE FROM idem_outbox WHERE id IN (
    SELECT id FROM idem_outbox
    WHERE sent_at IS NOT NULL AND sent_at <= floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint - $1
    ORDER BY sent_at
    LIMIT $2);

-- name: outbox_backlog
-- The pending messages, counted over the partial index idem_outbox_pending, the
-- creation of the oldest, and the database's now (unix milliseconds).
SELECT count(*), min(created_at), floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
FROM idem_outbox
WHERE sent_at IS NULL;

-- Statements of InboxStore (package inbox), on idem_inbox (migration
-- "inbox"). A claim is inbox_insert for a new message (one statement);
-- for a known one, inbox_lock reads the row under a row lock and
-- inbox_update writes what InboxStore decided, in one transaction (the
-- caller's, for ClaimTx).

-- name: inbox_insert
-- params: message_id group lease_ms status
-- A new record with status (processing for Claim; succeeded for ClaimTx,
-- which commits it with the effect), attempt 1, fence 1; RETURNING the
-- database's now. No row: the record exists (a concurrent insert is
-- waited for).
INSERT INTO idem_inbox (message_id, consumer_group, status, attempts, fence, lease_until, created_at, updated_at)
VALUES ($1, $2, $4, 1, 1, floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint + $3, floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint, floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint)
ON CONFLICT (message_id, consumer_group) DO NOTHING
RETURNING created_at;

-- name: inbox_lock
-- params: message_id group
-- The record under a row lock, with the database's now.
SELECT status, attempts, fence, lease_until, floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
FROM idem_inbox WHERE message_id = $1 AND consumer_group = $2
FOR UPDATE;

-- name: inbox_update
-- params: message_id group status attempts fence lease_until at
UPDATE idem_inbox SET status = $3, attempts = $4, fence = $5, lease_until = $6, updated_at = $7
WHERE message_id = $1 AND consumer_group = $2;

-- name: inbox_finish
-- params: message_id group fence
UPDATE idem_inbox SET status = 'succeeded', updated_at = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
WHERE message_id = $1 AND consumer_group = $2 AND status = 'processing' AND fence = $3;

-- name: inbox_fail
-- params: message_id group fence max_attempts reason
-- Ends the attempt of fence: failed, or dead after max_attempts. No row:
-- fenced out.
UPDATE idem_inbox SET
    status      = CASE WHEN attempts >= $4 THEN 'dead' ELSE 'failed' END,
    last_error  = $5,
    lease_until = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint,
    updated_at  = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
WHERE message_id = $1 AND consumer_group = $2 AND status = 'processing' AND fence = $3
RETURNING status;

-- name: inbox_extend
-- params: message_id group fence lease_ms
UPDATE idem_inbox SET lease_until = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint + $4
WHERE message_id = $1 AND consumer_group = $2 AND status = 'processing' AND fence = $3
  AND lease_until > floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint;

-- name: inbox_get
-- params: message_id group
SELECT status, attempts, fence, lease_until, last_error, created_at, updated_at
FROM idem_inbox WHERE message_id = $1 AND consumer_group = $2;

-- name: inbox_sweep
-- params: retention_ms limit
-- Deletes up to limit records no delivery works on: succeeded, failed and
-- dead ones last updated more than retention_ms ago, and processing ones
-- whose lease ended more than retention_ms ago. A processing record was
-- last updated by its claim, before its lease ended, so both are among
-- the rows idem_inbox_updated finds; the only rows that scan passes over
-- are processing records claimed long ago whose lease is still live or
-- ended lately. ORDER BY updated_at keeps the planner on that index
-- (the bound is no constant it could estimate), oldest first; the rows
-- found are deleted by their ctid (a TID scan: a join on the key would
-- read the whole table). SKIP LOCKED leaves rows a transaction holds (a
-- claim deciding on it); FOR UPDATE checks the condition again on a row
-- that changed since the statement began, and keeps the row, and so its
-- ctid, as it is until the delete.
DELETE FROM idem_inbox WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM idem_inbox
    WHERE updated_at <= floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint - $1
      AND (status <> 'processing' OR lease_until <= floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint - $1)
    ORDER BY updated_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED));

-- name: inbox_list
-- params: status limit
-- InboxStore.List: the records of one status, least recently updated
-- first. An operator's read (the operator page): it scans the rows of
-- every status in updated_at's order and keeps those of status.
SELECT message_id, consumer_group, status, attempts, fence, lease_until, last_error, created_at, updated_at
FROM idem_inbox WHERE status = $1
ORDER BY updated_at, consumer_group, message_id
LIMIT $2;

-- name: inbox_revive
-- params: message_id group
-- InboxStore.Revive: a dead record becomes failed with no attempt
-- counted, so that its next delivery claims it (fence + 1) and runs the
-- handler again, up to max_attempts more times. Only a dead record.
UPDATE idem_inbox SET status = 'failed', attempts = 0, lease_until = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint, updated_at = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
WHERE message_id = $1 AND consumer_group = $2 AND status = 'dead';

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
WHERE scope = $1 AND idempotency_key = $2 AND owner = $3 AND fence = $4 FOR UPDATE;

-- name: steps_op_lock
-- params: scope key
-- The operation, under a row lock, in Begin, Fail, Settle and Retry.
SELECT name, fingerprint, status, attempts FROM idem_ops
WHERE scope = $1 AND idempotency_key = $2 FOR UPDATE;

-- name: steps_op_insert
-- params: scope key name fingerprint input delay_ms
-- A new operation, running its first attempt.
INSERT INTO idem_ops (scope, idempotency_key, name, fingerprint, input, status, attempts, next_at, last_error, created_at, updated_at, expires_at)
VALUES ($1, $2, $3, $4, $5, 'running', 1, floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint + $6, '', floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint, floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint, 0);

-- name: steps_op_begin
-- params: name fingerprint input attempts delay_ms scope key
-- An attempt begins: the operation runs (as it is, or replaced by
-- another under the key), with attempts counted by StepJournal.Begin.
UPDATE idem_ops SET name = $1, fingerprint = $2, input = $3, status = 'running',
    attempts = $4, next_at = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint + $5, last_error = '', updated_at = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint, expires_at = 0
WHERE scope = $6 AND idempotency_key = $7;

-- name: steps_drop
-- params: scope key
-- Drops the operation's checkpoints.
DELETE FROM idem_steps WHERE scope = $1 AND idempotency_key = $2;

-- name: steps_checkpoints
-- params: scope key
-- The operation's checkpoints, in the order they were saved.
SELECT step, result, created_at FROM idem_steps
WHERE scope = $1 AND idempotency_key = $2
ORDER BY id;

-- name: steps_save
-- params: scope key step result
-- A checkpoint; no row if the step has one already.
INSERT INTO idem_steps (scope, idempotency_key, step, result, created_at)
VALUES ($1, $2, $3, $4, floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint)
ON CONFLICT (scope, idempotency_key, step) DO NOTHING;

-- name: steps_fail
-- params: max_attempts delay_ms reason scope key
-- Ends a running attempt: waiting until delay_ms from now, or dead
-- after max_attempts.
UPDATE idem_ops SET
    status = CASE WHEN attempts >= $1 THEN 'dead' ELSE 'waiting' END,
    next_at = CASE WHEN attempts >= $1 THEN 0 ELSE floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint + $2 END,
    last_error = $3, updated_at = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
WHERE scope = $4 AND idempotency_key = $5 AND status = 'running';

-- name: steps_finish
-- params: retention_ms scope key
-- The operation is done (its record completed), kept for retention_ms.
UPDATE idem_ops SET status = 'done', next_at = 0, last_error = '', updated_at = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint, expires_at = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint + $1
WHERE scope = $2 AND idempotency_key = $3 AND status <> 'done';

-- name: steps_settle_done
-- params: retention_ms scope key fingerprint
-- The completer found the record completed: done, if the operation
-- is the record's (its fingerprint) and not done.
UPDATE idem_ops SET status = 'done', next_at = 0, last_error = '', updated_at = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint, expires_at = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint + $1
WHERE scope = $2 AND idempotency_key = $3 AND fingerprint = $4 AND status <> 'done';

-- name: steps_settle_dead
-- params: reason scope key fingerprint status attempts
-- The completer cannot resume the operation: dead, with the reason, if
-- it is still as the completer read it (status, attempts).
UPDATE idem_ops SET status = 'dead', next_at = 0, last_error = $1, updated_at = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
WHERE scope = $2 AND idempotency_key = $3 AND fingerprint = $4 AND status <> 'done' AND status = $5 AND attempts = $6;

-- name: steps_due
-- params: name limit
-- Operations of one name the completer may take up, earliest first.
SELECT scope, idempotency_key, name, fingerprint, input, status, attempts, next_at, last_error, created_at, updated_at, expires_at FROM idem_ops
WHERE name = $1 AND status IN ('running', 'waiting') AND next_at <= floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
ORDER BY next_at
LIMIT $2;

-- name: steps_postpone
-- params: delay_ms scope key
-- Moves a running or waiting operation's next_at.
UPDATE idem_ops SET next_at = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint + $1
WHERE scope = $2 AND idempotency_key = $3 AND status IN ('running', 'waiting');

-- name: steps_get
-- params: scope key
-- One operation.
SELECT scope, idempotency_key, name, fingerprint, input, status, attempts, next_at, last_error, created_at, updated_at, expires_at FROM idem_ops
WHERE scope = $1 AND idempotency_key = $2;

-- name: steps_list
-- params: status limit
-- The operations of one status, least recently updated first: an
-- operator's read, which no index serves.
SELECT scope, idempotency_key, name, fingerprint, input, status, attempts, next_at, last_error, created_at, updated_at, expires_at FROM idem_ops
WHERE status = $1
ORDER BY updated_at, scope, idempotency_key
LIMIT $2;

-- name: steps_retry
-- params: scope key
-- A dead operation (its attempts from 0 again) or a waiting one
-- becomes due now. attempts is set before status: MySQL assigns in order.
UPDATE idem_ops SET attempts = CASE WHEN status = 'dead' THEN 0 ELSE attempts END,
    status = 'waiting', next_at = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint, updated_at = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
WHERE scope = $1 AND idempotency_key = $2 AND status IN ('dead', 'waiting');

-- name: steps_sweep
-- params: limit
-- Deletes up to limit done operations whose retention ended.
DELETE FROM idem_ops WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM idem_ops
    WHERE status = 'done' AND expires_at <= floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED));
