-- Version 3: shop_jobs, the fence the close job's writes present. Each
-- close transaction raises last_fence to its lease's fence (package lock,
-- the lock "shop.close-unpaid" in idem_locks) only while last_fence is not
-- higher, so a holder that lost its lease cannot write after a newer
-- holder did. fenced_writes counts those transactions; it also makes
-- every one of them change the row (MySQL reports an UPDATE that changes
-- nothing as 0 rows, which would read as "fenced out"). Both statements
-- are safe to rerun.
CREATE TABLE IF NOT EXISTS shop_jobs (
    name          VARCHAR(64) NOT NULL PRIMARY KEY,
    last_fence    BIGINT      NOT NULL DEFAULT 0 CHECK (last_fence >= 0),
    fenced_writes BIGINT      NOT NULL DEFAULT 0
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
INSERT IGNORE INTO shop_jobs (name, last_fence) VALUES ('shop.close-unpaid', 0);
