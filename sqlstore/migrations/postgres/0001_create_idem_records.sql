-- idem_records holds one row per (scope, idempotency_key). Times are unix
-- milliseconds on the database's clock; durations are milliseconds.
CREATE TABLE idem_records (
    scope           text     NOT NULL,
    idempotency_key text     NOT NULL,
    fingerprint     text     NOT NULL,
    status          text     NOT NULL CHECK (status IN ('processing', 'completed')),
    owner           text     NOT NULL,
    fence           bigint   NOT NULL CHECK (fence > 0),
    lease_until     bigint   NOT NULL,
    retention_ms    bigint   NOT NULL CHECK (retention_ms > 0),
    response_status integer,
    response_header text,
    response_body   bytea,
    body_omitted    boolean  NOT NULL DEFAULT false,
    created_at      bigint   NOT NULL,
    completed_at    bigint,
    expires_at      bigint   NOT NULL,
    PRIMARY KEY (scope, idempotency_key)
);

-- Sweep deletes by expires_at.
CREATE INDEX idem_records_expires_at ON idem_records (expires_at);
