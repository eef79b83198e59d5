-- idem_locks holds one row per lock name (package lock, LockBackend):
-- its owner ('' while free), its fence and its lease's end, in unix
-- milliseconds on the database's clock. A release clears the owner and
-- keeps the row, so the fence goes on increasing across releases and
-- expiries. name is VARBINARY, compared byte for byte (a _bin text
-- collation pads spaces: 'a' and 'a ' would be one lock). One statement,
-- rerun harmlessly after an interruption (IF NOT EXISTS).
CREATE TABLE IF NOT EXISTS idem_locks (
    name        VARBINARY(255) NOT NULL PRIMARY KEY,
    owner       VARBINARY(64)  NOT NULL,
    fence       BIGINT         NOT NULL,
    lease_until BIGINT         NOT NULL,
    CONSTRAINT idem_locks_fence CHECK (fence > 0)
) ENGINE = InnoDB;
