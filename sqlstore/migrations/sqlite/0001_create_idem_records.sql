-- idem_records holds one row per (scope, idempotency_key). Times are unix
-- milliseconds on the database's clock; durations are milliseconds.
CREATE TABLE idem_records (
    scope           TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    fingerprint     TEXT    NOT NULL,
    status          TEXT    NOT NULL CHECK (status IN ('processing', 'completed')),
    owner           TEXT    NOT NULL,
    fence           INTEGER NOT NULL CHECK (fence > 0),
    lease_until     INTEGER NOT NULL,
    retention_ms    INTEGER NOT NULL CHECK (retention_ms > 0),
    response_status INTEGER,
    response_header TEXT,
    response_body   BLOB,
    body_omitted    INTEGER NOT NULL DEFAULT 0 CHECK (body_omitted IN (0, 1)),
    created_at      INTEGER NOT NULL,
    completed_at    INTEGER,
    expires_at      INTEGER NOT NULL,
    PRIMARY KEY (scope, idempotency_key)
) STRICT;

-- Sweep deletes by expires_at.
CREATE INDEX idem_records_expires_at ON idem_records (expires_at);
