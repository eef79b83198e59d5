-- idem_inbox holds the consume records of package inbox (InboxStore):
-- one row per (message_id, consumer_group), with its status, the number
-- of attempts, the fence (+1 on every claim) and the lease's end. Times
-- are unix milliseconds on the database's clock. IDs compare byte for
-- byte (collation "C"). The partial index serves Sweep, which removes
-- succeeded and dead records after a retention.
CREATE TABLE idem_inbox (
    message_id     text COLLATE "C" NOT NULL,
    consumer_group text COLLATE "C" NOT NULL,
    status         text    NOT NULL CHECK (status IN ('processing', 'succeeded', 'failed', 'dead')),
    attempts       integer NOT NULL CHECK (attempts >= 0),
    fence          bigint  NOT NULL CHECK (fence > 0),
    lease_until    bigint  NOT NULL,
    last_error     text    NOT NULL DEFAULT '',
    created_at     bigint  NOT NULL,
    updated_at     bigint  NOT NULL,
    PRIMARY KEY (message_id, consumer_group)
);
CREATE INDEX idem_inbox_finished ON idem_inbox (updated_at) WHERE status IN ('succeeded', 'dead');
