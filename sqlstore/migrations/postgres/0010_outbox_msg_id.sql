-- msg_id is the message's ID, fixed when the row is added (OutboxStore.Add:
-- OutboxConfig.IDPrefix and outbox.NewID, a time-ordered random part) and
-- read back by every claim, so that a message keeps its ID whatever the
-- relay's configuration when it is published, and no two messages share
-- one across databases or across the life of one (a database re-created,
-- or restored from a backup, gives its row ids again to other messages).
-- NULL in the rows added before this migration: their ID stays the one
-- they had, the prefix and the row's id. The unique index finds a message
-- by its ID and refuses a second row with one.
ALTER TABLE idem_outbox ADD COLUMN msg_id text COLLATE "C";
CREATE UNIQUE INDEX idem_outbox_msg_id ON idem_outbox (msg_id);
