-- msg_id is the message's ID, fixed when the row is added (OutboxStore.Add:
-- OutboxConfig.IDPrefix and outbox.NewID, a time-ordered random part) and
-- read back by every claim, so that a message keeps its ID whatever the
-- relay's configuration when it is published, and no two messages share
-- one across databases or across the life of one (a database re-created,
-- or restored from a backup, gives its row ids again to other messages).
-- NULL in the rows added before this migration: their ID stays the one
-- they had, the prefix and the row's id. The unique index finds a message
-- by its ID and refuses a second row with one; VARBINARY compares byte
-- for byte.
--
-- One ALTER, run only when the column is missing (MySQL 8 has no ADD
-- COLUMN IF NOT EXISTS), so that a rerun after an interruption is
-- harmless.
SET @idem_ddl = (
    SELECT IF(count(*) = 0,
        'ALTER TABLE idem_outbox ADD COLUMN msg_id VARBINARY(255) NULL, ADD UNIQUE KEY idem_outbox_msg_id (msg_id)',
        'DO 0')
    FROM information_schema.columns
    WHERE table_schema = DATABASE() AND table_name = 'idem_outbox' AND column_name = 'msg_id');
PREPARE idem_ddl FROM @idem_ddl;
EXECUTE idem_ddl;
DEALLOCATE PREPARE idem_ddl;
SET @idem_ddl = NULL;
