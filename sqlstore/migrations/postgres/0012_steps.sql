-- idem_ops holds the operations of package steps (StepJournal): one row
-- per idempotency key, with the operation's name, its input, its state
-- and the completer's schedule (next_at). idem_steps holds the
-- checkpoints of the operations not done: one row per step, written in
-- the transaction of a local step, or after a foreign step. Times are
-- unix milliseconds on the database's clock. The partial indexes serve
-- the completer (operations due) and Sweep (done operations expired).
CREATE TABLE idem_ops (
    scope           text    NOT NULL,
    idempotency_key text    NOT NULL,
    name            text    NOT NULL,
    fingerprint     text    NOT NULL,
    input           bytea   NOT NULL,
    status          text    NOT NULL CHECK (status IN ('running', 'waiting', 'done', 'dead')),
    attempts        integer NOT NULL CHECK (attempts >= 0),
    next_at         bigint  NOT NULL,
    last_error      text    NOT NULL DEFAULT '',
    created_at      bigint  NOT NULL,
    updated_at      bigint  NOT NULL,
    expires_at      bigint  NOT NULL,
    PRIMARY KEY (scope, idempotency_key)
);
CREATE INDEX idem_ops_due ON idem_ops (name, next_at) WHERE status IN ('running', 'waiting');
CREATE INDEX idem_ops_expires ON idem_ops (expires_at) WHERE status = 'done';
CREATE TABLE idem_steps (
    id              bigserial NOT NULL,
    scope           text   NOT NULL,
    idempotency_key text   NOT NULL,
    step            text   NOT NULL,
    result          bytea,
    created_at      bigint NOT NULL,
    PRIMARY KEY (scope, idempotency_key, step)
);
