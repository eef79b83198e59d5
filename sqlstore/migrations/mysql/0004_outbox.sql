-- idem_outbox holds the messages of package outbox (OutboxStore): added
-- in the business transaction, pending while sent_at is NULL, swept after
-- a retention once sent. id is the message's ID (with the store's
-- prefix) and orders each key's messages; msg_key '' is no key, compared
-- byte for byte (VARBINARY). Times are unix milliseconds on the
-- database's clock. The indexes serve the relay's claim (pending rows by
-- id; a key's pending rows by id) and the sweep. One statement, rerun
-- harmlessly after an interruption (IF NOT EXISTS).
CREATE TABLE IF NOT EXISTS idem_outbox (
    id         BIGINT          NOT NULL AUTO_INCREMENT PRIMARY KEY,
    topic      VARBINARY(255)  NOT NULL,
    msg_key    VARBINARY(255)  NOT NULL,
    payload    LONGBLOB        NOT NULL,
    headers    MEDIUMBLOB      NULL,
    created_at BIGINT          NOT NULL,
    sent_at    BIGINT          NULL,
    KEY idem_outbox_pending (sent_at, id),
    KEY idem_outbox_key (msg_key, sent_at, id)
) ENGINE = InnoDB;
