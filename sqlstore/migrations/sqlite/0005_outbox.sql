-- idem_outbox holds the messages of package outbox (OutboxStore): added
-- in the business transaction, pending while sent_at is NULL, swept after
-- a retention once sent. id is the message's ID (with the store's
-- prefix) and orders each key's messages (AUTOINCREMENT: an id is never
-- reused, even after a sweep emptied the table); msg_key '' is no key.
-- Times are unix milliseconds on the database's clock.
CREATE TABLE idem_outbox (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    topic      TEXT    NOT NULL,
    msg_key    TEXT    NOT NULL,
    payload    BLOB    NOT NULL,
    headers    TEXT,
    created_at INTEGER NOT NULL,
    sent_at    INTEGER
) STRICT;
CREATE INDEX idem_outbox_pending ON idem_outbox (id) WHERE sent_at IS NULL;
CREATE INDEX idem_outbox_pending_key ON idem_outbox (msg_key, id) WHERE sent_at IS NULL;
CREATE INDEX idem_outbox_sent ON idem_outbox (sent_at) WHERE sent_at IS NOT NULL;
