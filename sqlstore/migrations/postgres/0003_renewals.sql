-- Renewals that do not write the record's row.
--
-- Extend used to UPDATE idem_records. A business transaction under
-- REPEATABLE READ or SERIALIZABLE that completes the record with
-- CompleteTx then failed with a serialization failure (SQLSTATE 40001)
-- whenever a renewal had updated the row after its snapshot, although
-- nobody else touched the record. Renewals now live in idem_renewals,
-- one row per key: the lease of the owner and fence that wrote it.
-- Extend checks the record under a share lock (SELECT … FOR SHARE: a
-- row lock that a committed transaction held is no update, and makes no
-- later update fail) and upserts the renewal. The record's lease is the
-- renewal's when the renewal carries the record's owner and fence (the
-- owner is 128 random bits, so a row left by an earlier owner of the key
-- never matches), and its own lease_until otherwise; the expiry of a
-- processing record follows: lease + retention. idem_records_renewed
-- reads records so; every statement that decides on a lease or an
-- expiry, or returns a record, reads it, or applies the same rule.
--
-- Extend, a takeover and Sweep all lock the record's row before they
-- touch its renewal, so they are ordered by that lock. A renewal that
-- committed before a takeover's lock was granted must be seen by the
-- takeover: idem_acquire_write reads it in a statement that starts after
-- the lock (under READ COMMITTED, a new snapshot), and, should the
-- caller's session run REPEATABLE READ or SERIALIZABLE, where the
-- snapshot is older, confirms it by upserting the renewal row, which
-- fails with 40001 if that row changed after the snapshot (Acquire then
-- runs again). Sweep runs idem_sweep in a READ COMMITTED transaction.
CREATE TABLE idem_renewals (
    scope           text   NOT NULL,
    idempotency_key text   NOT NULL,
    owner           text   NOT NULL,
    fence           bigint NOT NULL,
    lease_until     bigint NOT NULL,
    -- lease_until + the record's retention_ms: the processing record's
    -- expiry while this is its lease.
    expires_at      bigint NOT NULL,
    PRIMARY KEY (scope, idempotency_key)
);

-- Sweep finds lapsed renewals through it.
CREATE INDEX idem_renewals_expires_at ON idem_renewals (expires_at);

-- took_over says whether the processing record's current lease replaced
-- another processing record (a takeover of an ended lease, or the
-- replacement of a record abandoned past its expiry): Acquire reports it
-- as AcquireResult.TookOver. created_at cannot tell it any more: the
-- replacement of an expired record is a new record, created then. It
-- means nothing once the record is completed.
ALTER TABLE idem_records ADD COLUMN took_over boolean NOT NULL DEFAULT false;

-- idem_renewed_lease returns the end of a processing record's lease:
-- its renewal's, if the key's renewal carries the record's owner and
-- fence, and else the record's own lease_until. It is STABLE: its read
-- uses the snapshot of the statement that calls it.
CREATE FUNCTION idem_renewed_lease(
    p_scope text, p_key text, p_owner text, p_fence bigint, p_lease_until bigint)
RETURNS bigint
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    renewed bigint;
BEGIN
    SELECT n.lease_until INTO renewed FROM idem_renewals AS n
    WHERE n.scope = p_scope AND n.idempotency_key = p_key
      AND n.owner = p_owner AND n.fence = p_fence;
    RETURN coalesce(renewed, p_lease_until);
END
$$;

-- The records as the store reports them: a processing record's
-- lease_until and expires_at are those of its renewal, if it has one.
-- The renewal is read only for a processing record (CASE evaluates its
-- branches lazily), so a replay of a completed record reads one row. The
-- renewal is read by a function rather than a subquery or a join: a
-- subquery's plan is set up at every execution of the statement, run or
-- not, which cost a replay about 10 µs where the function call costs 5
-- (measured with pgbench on PostgreSQL 15); OFFSET 0 keeps the lateral
-- subquery from being flattened, which would call the function once per
-- reference to lease_until.
CREATE VIEW idem_records_renewed AS
SELECT r.scope, r.idempotency_key, r.fingerprint, r.status, r.owner, r.fence,
       e.lease_until, r.retention_ms, r.response_status, r.response_header,
       r.response_body, r.body_omitted, r.created_at, r.completed_at,
       CASE WHEN r.status = 'processing' THEN e.lease_until + r.retention_ms
            ELSE r.expires_at END AS expires_at,
       r.took_over
FROM idem_records AS r
CROSS JOIN LATERAL (
    SELECT CASE WHEN r.status = 'processing'
                THEN idem_renewed_lease(r.scope, r.idempotency_key, r.owner, r.fence, r.lease_until)
                ELSE r.lease_until END AS lease_until
    OFFSET 0) AS e;

-- idem_acquire_write is the write half of Acquire (see migration 2: the
-- acquire statement reads a record it cannot take, from its snapshot, and
-- calls this function only when there is none). It inserts a new record;
-- or, when the key has one, locks it, reads its lease (its renewal's, if
-- any) in a new statement, and replaces it if it has expired, or takes
-- it over if it is processing with the same fingerprint and its lease
-- has ended; otherwise it returns it, as idem_records_renewed shows it:
-- another owner's. It returns no row if the record vanished between the
-- insert and the lock; the caller then starts over.
--
-- A takeover keeps created_at: the record goes on. A replaced expired
-- record is a new record, created now. took_over is set when the record
-- replaced was processing.
CREATE OR REPLACE FUNCTION idem_acquire_write(
    p_scope text, p_key text, p_fingerprint text, p_owner text,
    p_lease_ms bigint, p_retention_ms bigint)
RETURNS SETOF idem_records
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    now_ms    bigint := floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint;
    rec       idem_records;
    lease_end bigint;
    expiry    bigint;
BEGIN
    -- A new key: one insert. ON CONFLICT DO NOTHING waits for a
    -- concurrent insert of the key to end; under REPEATABLE READ it fails
    -- with 40001 on a row the snapshot does not show.
    RETURN QUERY
    INSERT INTO idem_records AS r (
        scope, idempotency_key, fingerprint, status, owner, fence,
        lease_until, retention_ms, created_at, expires_at)
    VALUES (p_scope, p_key, p_fingerprint, 'processing', p_owner, 1,
            now_ms + p_lease_ms, p_retention_ms, now_ms,
            now_ms + p_lease_ms + p_retention_ms)
    ON CONFLICT (scope, idempotency_key) DO NOTHING
    RETURNING r.*;
    IF FOUND THEN
        RETURN;
    END IF;

    -- The key has a record: lock its latest version. Extend takes a share
    -- lock on it before it writes a renewal, so from here on no renewal
    -- of it can commit, and every one that did is visible to the
    -- statements below (each takes a new snapshot under READ COMMITTED).
    SELECT * INTO rec FROM idem_records
    WHERE scope = p_scope AND idempotency_key = p_key
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    lease_end := rec.lease_until;
    expiry := rec.expires_at;
    IF rec.status = 'processing' THEN
        SELECT n.lease_until INTO lease_end FROM idem_renewals AS n
        WHERE n.scope = p_scope AND n.idempotency_key = p_key
          AND n.owner = rec.owner AND n.fence = rec.fence;
        IF NOT FOUND THEN
            lease_end := rec.lease_until;
        END IF;
        expiry := lease_end + rec.retention_ms;
    END IF;

    IF expiry > now_ms
       AND (rec.status = 'completed' OR rec.fingerprint <> p_fingerprint OR lease_end > now_ms) THEN
        rec.lease_until := lease_end;
        rec.expires_at := expiry;
        RETURN NEXT rec;
        RETURN;
    END IF;

    IF rec.status = 'processing' THEN
        -- The renewal row now carries the new lease. Under READ COMMITTED
        -- the read above saw the latest renewal; under REPEATABLE READ or
        -- SERIALIZABLE it saw the transaction's snapshot, and this upsert
        -- fails with 40001 if the row changed after it: a renewal the
        -- read missed.
        INSERT INTO idem_renewals AS n (
            scope, idempotency_key, owner, fence, lease_until, expires_at)
        VALUES (p_scope, p_key, p_owner, rec.fence + 1, now_ms + p_lease_ms,
                now_ms + p_lease_ms + p_retention_ms)
        ON CONFLICT (scope, idempotency_key) DO UPDATE SET
            owner       = excluded.owner,
            fence       = excluded.fence,
            lease_until = excluded.lease_until,
            expires_at  = excluded.expires_at;
    END IF;

    RETURN QUERY
    UPDATE idem_records AS r SET
        fingerprint     = p_fingerprint,
        status          = 'processing',
        owner           = p_owner,
        fence           = rec.fence + 1,
        lease_until     = now_ms + p_lease_ms,
        retention_ms    = p_retention_ms,
        response_status = NULL,
        response_header = NULL,
        response_body   = NULL,
        body_omitted    = false,
        created_at      = CASE WHEN expiry > now_ms THEN rec.created_at ELSE now_ms END,
        completed_at    = NULL,
        expires_at      = now_ms + p_lease_ms + p_retention_ms,
        took_over       = (rec.status = 'processing')
    WHERE r.scope = p_scope AND r.idempotency_key = p_key
    RETURNING r.*;
END
$$;

-- idem_sweep removes up to p_limit records whose expiry (a processing
-- record's: its renewal's, if any) has passed and whose row no other
-- transaction holds, with their renewals, and up to p_limit lapsed
-- renewals that are no processing record's lease; it returns the number
-- of records removed. Run it in a READ COMMITTED transaction: it locks
-- the candidates first and decides in a later statement, whose snapshot
-- then shows every renewal that committed before the locks were granted
-- (and no other can commit while they are held).
CREATE FUNCTION idem_sweep(p_limit bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    now_ms  bigint := floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint;
    scopes  text[];
    keys    text[];
    more_s  text[];
    more_k  text[];
    removed bigint;
BEGIN
    -- Records past their own expires_at (idem_records_expires_at) whose
    -- lease is not renewed past now.
    SELECT coalesce(array_agg(c.scope), '{}'), coalesce(array_agg(c.idempotency_key), '{}')
    INTO scopes, keys
    FROM (
        SELECT r.scope, r.idempotency_key
        FROM idem_records AS r
        LEFT JOIN idem_renewals AS n
          ON r.status = 'processing' AND n.scope = r.scope AND n.idempotency_key = r.idempotency_key
         AND n.owner = r.owner AND n.fence = r.fence
        WHERE r.expires_at <= now_ms
          AND (r.status = 'completed'
               OR (r.lease_until <= now_ms AND n.scope IS NULL)
               OR (n.lease_until <= now_ms AND n.expires_at <= now_ms))
        ORDER BY r.expires_at
        LIMIT p_limit
        FOR UPDATE OF r SKIP LOCKED) AS c;
    -- Processing records whose renewal shortened their lease and has
    -- expired before their own expires_at (idem_renewals_expires_at).
    IF cardinality(scopes) < p_limit THEN
        SELECT coalesce(array_agg(c.scope), '{}'), coalesce(array_agg(c.idempotency_key), '{}')
        INTO more_s, more_k
        FROM (
            SELECT r.scope, r.idempotency_key
            FROM idem_renewals AS n
            JOIN idem_records AS r
              ON r.scope = n.scope AND r.idempotency_key = n.idempotency_key
             AND r.owner = n.owner AND r.fence = n.fence AND r.status = 'processing'
            WHERE n.expires_at <= now_ms AND n.lease_until <= now_ms AND r.expires_at > now_ms
            ORDER BY n.expires_at
            LIMIT p_limit - cardinality(scopes)
            FOR UPDATE OF r SKIP LOCKED) AS c;
        scopes := scopes || more_s;
        keys := keys || more_k;
    END IF;

    -- A new statement: decide on the locked records as they are now.
    WITH gone AS (
        DELETE FROM idem_records AS r
        USING idem_records_renewed AS v, unnest(scopes, keys) AS c(scope, idempotency_key)
        WHERE r.scope = c.scope AND r.idempotency_key = c.idempotency_key
          AND v.scope = r.scope AND v.idempotency_key = r.idempotency_key
          AND v.expires_at <= now_ms
          AND (v.status = 'completed' OR v.lease_until <= now_ms)
        RETURNING r.scope, r.idempotency_key),
    renewals AS (
        DELETE FROM idem_renewals AS n
        USING gone AS g
        WHERE n.scope = g.scope AND n.idempotency_key = g.idempotency_key)
    SELECT count(*) INTO removed FROM gone;

    -- Lapsed renewals that no processing record holds as its lease: those
    -- of completed, released or deleted records, or left by an earlier
    -- owner. A renewal row that an Extend rewrote meanwhile is checked
    -- again as it is now (FOR UPDATE), and kept: its lease is live.
    DELETE FROM idem_renewals WHERE ctid IN (
        SELECT n.ctid FROM idem_renewals AS n
        WHERE n.expires_at <= now_ms
          AND NOT EXISTS (
              SELECT 1 FROM idem_records AS r
              WHERE r.scope = n.scope AND r.idempotency_key = n.idempotency_key
                AND r.status = 'processing' AND r.owner = n.owner AND r.fence = n.fence)
        ORDER BY n.expires_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED);
    RETURN removed;
END
$$;
