-- idem_locks holds one row per lock name (package lock, LockBackend):
-- its owner ('' while free), its fence and its lease's end, in unix
-- milliseconds on the database's clock. A release clears the owner and
-- keeps the row, so the fence goes on increasing across releases and
-- expiries. The name's collation is "C": names are compared byte for
-- byte, whatever the database's default collation.
CREATE TABLE idem_locks (
    name        text COLLATE "C" NOT NULL PRIMARY KEY,
    owner       text   NOT NULL,
    fence       bigint NOT NULL CHECK (fence > 0),
    lease_until bigint NOT NULL
);
