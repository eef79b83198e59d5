-- idem_ops holds the operations of package steps (StepJournal): one row
-- per idempotency key, with the operation's name, its input, its state
-- and the completer's schedule (next_at). idem_steps holds the
-- checkpoints of the operations not done: one row per step, written in
-- the transaction of a local step, or after a foreign step. Times are
-- unix milliseconds on the database's clock. (name, status, next_at) serves
-- the completer, (status, expires_at) Sweep.
CREATE TABLE IF NOT EXISTS idem_ops (
    scope           VARBINARY(255) NOT NULL,
    idempotency_key VARBINARY(255) NOT NULL,
    name            VARBINARY(255) NOT NULL,
    fingerprint     VARBINARY(255) NOT NULL,
    input           LONGBLOB       NOT NULL,
    status          VARCHAR(8) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    attempts        INT            NOT NULL,
    next_at         BIGINT         NOT NULL,
    last_error      BLOB           NOT NULL,
    created_at      BIGINT         NOT NULL,
    updated_at      BIGINT         NOT NULL,
    expires_at      BIGINT         NOT NULL,
    PRIMARY KEY (scope, idempotency_key),
    INDEX idem_ops_due (name, status, next_at),
    INDEX idem_ops_expires (status, expires_at),
    CONSTRAINT idem_ops_status CHECK (status IN ('running', 'waiting', 'done', 'dead')),
    CONSTRAINT idem_ops_attempts CHECK (attempts >= 0)
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS idem_steps (
    id              BIGINT         NOT NULL AUTO_INCREMENT,
    scope           VARBINARY(255) NOT NULL,
    idempotency_key VARBINARY(255) NOT NULL,
    step            VARBINARY(255) NOT NULL,
    result          LONGBLOB       NULL,
    created_at      BIGINT         NOT NULL,
    PRIMARY KEY (scope, idempotency_key, step),
    INDEX idem_steps_id (id)
) ENGINE = InnoDB;
