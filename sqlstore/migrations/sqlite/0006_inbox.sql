-- idem_inbox holds the consume records of package inbox (InboxStore):
-- one row per (message_id, consumer_group), with its status, the number
-- of attempts, the fence (+1 on every claim) and the lease's end. Times
-- are unix milliseconds on the database's clock. TEXT compares byte for
-- byte. The partial index serves Sweep.
CREATE TABLE idem_inbox (
    message_id     TEXT    NOT NULL,
    consumer_group TEXT    NOT NULL,
    status         TEXT    NOT NULL CHECK (status IN ('processing', 'succeeded', 'failed', 'dead')),
    attempts       INTEGER NOT NULL CHECK (attempts >= 0),
    fence          INTEGER NOT NULL CHECK (fence > 0),
    lease_until    INTEGER NOT NULL,
    last_error     TEXT    NOT NULL DEFAULT '',
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    PRIMARY KEY (message_id, consumer_group)
) STRICT;
CREATE INDEX idem_inbox_finished ON idem_inbox (updated_at) WHERE status IN ('succeeded', 'dead');
