-- idem_acquire_write is the write half of Acquire. The acquire statement
-- (queries/postgres.sql) reads the record that Acquire cannot take and
-- calls this function only when there is none, so a replay or a
-- duplicate is a plain primary-key read: a data-modifying WITH clause
-- would cost every call the executor set-up of an INSERT … ON CONFLICT
-- even when it inserts nothing, about twice what the function scan that
-- is never executed costs (measured: 10 µs against 5 µs a call).
--
-- It inserts a new record, or replaces a record past its expiry, or takes
-- over a processing record with the same fingerprint whose lease has
-- ended, and returns it: the record is then the caller's, with the
-- caller's owner (128 random bits, which no other record has). When the
-- insert meets a row that is not ours to take (one the caller's snapshot
-- did not show: committed since, or in progress, which the insert waits
-- for), the DO UPDATE's WHERE is false and nothing is returned; the
-- function then reads that row in a new statement, and so, under READ
-- COMMITTED, a new snapshot, and returns it: another owner's. It returns
-- no row only if that row is gone again (or no longer held), and the
-- caller starts over.
--
-- Replacing a processing record keeps created_at, so created_at <>
-- lease_until - lease_ms tells a takeover. "now" is
-- statement_timestamp(): the start of the client's statement, the same
-- instant the caller's read used.
CREATE FUNCTION idem_acquire_write(
    p_scope text, p_key text, p_fingerprint text, p_owner text,
    p_lease_ms bigint, p_retention_ms bigint)
RETURNS SETOF idem_records
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    now_ms bigint := floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint;
BEGIN
    RETURN QUERY
    INSERT INTO idem_records AS r (
        scope, idempotency_key, fingerprint, status, owner, fence,
        lease_until, retention_ms, created_at, expires_at)
    VALUES (p_scope, p_key, p_fingerprint, 'processing', p_owner, 1,
            now_ms + p_lease_ms, p_retention_ms, now_ms,
            now_ms + p_lease_ms + p_retention_ms)
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
        body_omitted    = false,
        created_at      = CASE WHEN r.status = 'processing' THEN r.created_at ELSE excluded.created_at END,
        completed_at    = NULL,
        expires_at      = excluded.expires_at
    WHERE r.expires_at <= excluded.created_at
       OR (r.status = 'processing' AND r.fingerprint = excluded.fingerprint
           AND r.lease_until <= excluded.created_at)
    RETURNING r.*;
    IF FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT h.* FROM idem_records AS h
    WHERE h.scope = p_scope AND h.idempotency_key = p_key
      AND h.expires_at > now_ms
      AND (h.status = 'completed' OR h.fingerprint <> p_fingerprint OR h.lease_until > now_ms);
END
$$;
