-- idem_locks holds one row per lock name (package lock, LockBackend):
-- its owner ('' while free), its fence and its lease's end, in unix
-- milliseconds on the database's clock. A release clears the owner and
-- keeps the row, so the fence goes on increasing across releases and
-- expiries. TEXT compares byte for byte (the BINARY collation).
CREATE TABLE idem_locks (
    name        TEXT    NOT NULL PRIMARY KEY,
    owner       TEXT    NOT NULL,
    fence       INTEGER NOT NULL CHECK (fence > 0),
    lease_until INTEGER NOT NULL
) STRICT;
