-- Duplicates of a held key take no row lock.
--
-- idem_acquire_write (migration 3) locked the record's row (SELECT … FOR
-- UPDATE) whenever its insert met an existing record. It is called when
-- the acquire statement's snapshot shows no record Acquire cannot take:
-- a new key, or a key that a concurrent caller inserted after the
-- snapshot. When many requests with one new key arrive together (a
-- double-click, a client's burst of retries, several proxies), all but
-- the first take that second path, and queued for the row lock one
-- after the other; the owner's first renewal (Extend takes a share lock
-- on the row) queued behind them. On a loaded server the queue outlasted
-- a short lease, and the owner lost a key that nobody else could take.
-- The function now reads the record (with its lease as renewed) in a
-- statement of its own first, and returns it without locking if another
-- owner holds it: the answer the acquire statement gives from its own
-- snapshot. A record Acquire may take (expired, or processing with the
-- same fingerprint and its lease ended) is locked and read again as
-- before. Under REPEATABLE READ or SERIALIZABLE the read sees the
-- transaction's snapshot, which showed no such record to the acquire
-- statement, so nothing changes there.
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

    -- The key has a record. Read it first without a lock, in a new
    -- statement (under READ COMMITTED a new snapshot, which shows the
    -- insert this call waited for): if another owner holds it, return
    -- it as it is, as the acquire statement does with a record its
    -- snapshot shows. Only a record Acquire may take is locked. Every
    -- concurrent duplicate of a new key comes here, and used to queue
    -- for the row lock one after the other, with the owner's renewal
    -- (whose share lock waits behind them) at the end of the queue.
    SELECT v.scope, v.idempotency_key, v.fingerprint, v.status, v.owner,
           v.fence, v.lease_until, v.retention_ms, v.response_status,
           v.response_header, v.response_body, v.body_omitted,
           v.created_at, v.completed_at, v.expires_at, v.took_over
    INTO rec FROM idem_records_renewed AS v
    WHERE v.scope = p_scope AND v.idempotency_key = p_key;
    IF FOUND AND rec.expires_at > now_ms
       AND (rec.status = 'completed' OR rec.fingerprint <> p_fingerprint
            OR rec.lease_until > now_ms) THEN
        RETURN NEXT rec;
        RETURN;
    END IF;

    -- A record Acquire may take: lock its latest version. Extend takes a share
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
