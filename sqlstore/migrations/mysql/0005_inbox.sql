-- idem_inbox holds the consume records of package inbox (InboxStore):
-- one row per (message_id, consumer_group), with its status, the number
-- of attempts, the fence (+1 on every claim) and the lease's end. Times
-- are unix milliseconds on the database's clock. IDs are VARBINARY,
-- compared byte for byte. last_error has no DEFAULT '' (under
-- EMPTY_STRING_IS_NULL that default is NULL): inserts write X''. The index
-- serves Sweep. One statement, rerun
-- harmlessly after an interruption (IF NOT EXISTS).
CREATE TABLE IF NOT EXISTS idem_inbox (
    message_id     VARBINARY(255) NOT NULL,
    consumer_group VARBINARY(255) NOT NULL,
    status         VARCHAR(10)    NOT NULL,
    attempts       INT            NOT NULL,
    fence          BIGINT         NOT NULL,
    lease_until    BIGINT         NOT NULL,
    last_error     VARBINARY(1024) NOT NULL,
    created_at     BIGINT         NOT NULL,
    updated_at     BIGINT         NOT NULL,
    PRIMARY KEY (message_id, consumer_group),
    INDEX idem_inbox_finished (status, updated_at),
    CONSTRAINT idem_inbox_status CHECK (status IN ('processing', 'succeeded', 'failed', 'dead')),
    CONSTRAINT idem_inbox_fence CHECK (fence > 0)
) ENGINE = InnoDB;
