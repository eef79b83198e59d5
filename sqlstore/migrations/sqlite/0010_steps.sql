-- idem_ops holds the operations of package steps (StepJournal): one row
-- per idempotency key, with the operation's name, its input, its state
-- and the completer's schedule (next_at). idem_steps holds the
-- checkpoints of the operations not done: one row per step, written in
-- the transaction of a local step, or after a foreign step. Times are
-- unix milliseconds on the database's clock. The partial indexes serve
-- the completer (operations due) and Sweep (done operations expired).
CREATE TABLE idem_ops (
    scope           TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    name            TEXT    NOT NULL,
    fingerprint     TEXT    NOT NULL,
    input           BLOB    NOT NULL,
    status          TEXT    NOT NULL CHECK (status IN ('running', 'waiting', 'done', 'dead')),
    attempts        INTEGER NOT NULL CHECK (attempts >= 0),
    next_at         INTEGER NOT NULL,
    last_error      TEXT    NOT NULL DEFAULT '',
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    expires_at      INTEGER NOT NULL,
    PRIMARY KEY (scope, idempotency_key)
) STRICT;
CREATE INDEX idem_ops_due ON idem_ops (name, next_at) WHERE status IN ('running', 'waiting');
CREATE INDEX idem_ops_expires ON idem_ops (expires_at) WHERE status = 'done';
CREATE TABLE idem_steps (
    scope           TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    step            TEXT    NOT NULL,
    result          BLOB,
    created_at      INTEGER NOT NULL,
    PRIMARY KEY (scope, idempotency_key, step)
) STRICT;
