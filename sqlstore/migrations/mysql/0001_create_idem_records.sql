-- idem_records holds one row per (scope, idempotency_key). Times are unix
-- milliseconds on the database's clock; durations are milliseconds.
--
-- scope, idempotency_key and fingerprint are VARBINARY(255): at most 255
-- bytes (idem.MaxKeyLen), compared byte for byte. A text column with a
-- _bin collation would not do: utf8mb4_bin is a PAD SPACE collation on
-- MySQL and MariaDB, under which 'k' and 'k ' are the same key. The
-- primary key is 510 bytes, well within InnoDB's 3072.
--
-- MySQL commits each DDL statement on its own, so the table and its index
-- are one statement: a migration interrupted half way cannot leave a table
-- without its index. IF NOT EXISTS makes a rerun after a crash between
-- this statement and the migration's record harmless.
CREATE TABLE IF NOT EXISTS idem_records (
    scope           VARBINARY(255) NOT NULL,
    idempotency_key VARBINARY(255) NOT NULL,
    fingerprint     VARBINARY(255) NOT NULL,
    status          VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    owner           VARBINARY(255) NOT NULL,
    fence           BIGINT     NOT NULL,
    lease_until     BIGINT     NOT NULL,
    retention_ms    BIGINT     NOT NULL,
    response_status INT        NULL,
    response_header LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    response_body   LONGBLOB   NULL,
    body_omitted    BOOLEAN    NOT NULL DEFAULT FALSE,
    created_at      BIGINT     NOT NULL,
    completed_at    BIGINT     NULL,
    expires_at      BIGINT     NOT NULL,
    PRIMARY KEY (scope, idempotency_key),
    INDEX idem_records_expires_at (expires_at),
    CONSTRAINT idem_records_status CHECK (status IN ('processing', 'completed')),
    CONSTRAINT idem_records_fence CHECK (fence > 0),
    CONSTRAINT idem_records_retention CHECK (retention_ms > 0)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;
