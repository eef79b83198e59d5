-- Script of bench/service/run's floor on MySQL/MariaDB, run by the
-- floor program (floor/main.go): the statements shopd sends for one
-- POST /orders, straight against the same database (its tables and
-- migrations), without HTTP, the middleware or database/sql.
--
--   floor -db mysql:root@tcp(127.0.0.1:3306)/bench_shop -f floor_mysql.sql -c 16 -d 6s
--
-- What one order sends, as MariaDB 10.11's general query log shows it
-- for shopd (go-sql-driver/mysql through database/sql, its default DSN
-- parameters: binary protocol, no client-side interpolation):
--
--   1. select_held  (sqlstore/queries/mysql.sql; Acquire's first read,
--                    autocommit; prepared once per connection by the
--                    store's statement cache: Execute only)
--   2. acquire      (the upsert, autocommit: its own transaction, which
--                    commits the processing record; Execute only)
--   3. START TRANSACTION (text)
--   4. reserveStock (cmd/internal/shop/shop.go: Prepare, Execute, Close)
--   5. productPrice (Prepare, Execute, Close)
--   6. insertOrder  (Prepare, Execute, Close)
--   7. complete     (sqlstore/queries/mysql.sql, run by CompleteTx in the
--                    order's transaction: Prepare, Execute; its Close
--                    follows the COMMIT)
--   8. COMMIT       (text)
--
-- shopd thus makes 12 round trips per order (a Close gets no answer):
-- the shop's statements, and complete inside a transaction, are passed
-- to database/sql as text with arguments, which the driver prepares,
-- executes and closes every time. The floor sends the same eight
-- statements, in the same order, with the same parameters, but prepares
-- each once per connection, as pgbench -M prepared does on PostgreSQL:
-- 8 round trips. The re-preparing is part of what shopd costs on top;
-- the statements marked "shopd: prepare each time" are those, and the
-- floor program's -reprepare (FLOOR_REPREPARE=1 bench/service/run
-- mariadb) re-prepares them as shopd does, to measure what that costs.
--
-- The parameters are the floor program's values (see its doc): scope
-- 'user:N', a key unique per transaction, order numbers 'ord_…', and
-- constants of the size and type of shopd's. The record is new, so
-- select_held finds nothing, the upsert inserts (one row) and its fence
-- is 1. The statement texts are copied from the files named above.

-- name: select_held
-- params: scope key fingerprint
-- rows: 0
SELECT scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM idem_records
WHERE scope = COALESCE(?, X'') AND idempotency_key = ?
  AND expires_at > (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
  AND (status = 'completed' OR fingerprint <> COALESCE(?, X'') OR lease_until > (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000));

-- name: acquire
-- params: scope key fingerprint owner lease_ms retention_ms lease_ms retention_ms
-- params: fingerprint owner
-- params: owner fingerprint
-- params: owner fingerprint
-- params: owner fingerprint fingerprint
-- params: owner fingerprint
-- params: owner fingerprint lease_ms
-- params: owner fingerprint retention_ms
-- params: owner fingerprint
-- params: owner fingerprint
-- params: owner fingerprint
-- params: owner fingerprint
-- params: owner fingerprint
-- params: owner fingerprint lease_ms retention_ms
-- affected: 1
INSERT INTO idem_records (
    scope, idempotency_key, fingerprint, status, owner, fence,
    lease_until, retention_ms, created_at, expires_at)
VALUES (
    COALESCE(?, X''), ?, COALESCE(?, X''), 'processing', ?, 1,
    (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ?,
    ?,
    LAST_INSERT_ID((TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)),
    (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ? + ?)
ON DUPLICATE KEY UPDATE
    owner = CASE WHEN LAST_INSERT_ID(
                CASE WHEN status = 'processing'
                          AND (expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
                               OR (fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
                     THEN 1
                     WHEN expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
                     THEN 2
                     ELSE 0 END) > 0
        THEN ? ELSE owner END,
    created_at = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
             AND expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
        THEN (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) ELSE created_at END,
    fence = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN fence + 1 ELSE fence END,
    fingerprint = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN COALESCE(?, X'') ELSE fingerprint END,
    status = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN 'processing' ELSE status END,
    lease_until = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ? ELSE lease_until END,
    retention_ms = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN ? ELSE retention_ms END,
    response_status = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN NULL ELSE response_status END,
    response_header = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN NULL ELSE response_header END,
    response_body = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN NULL ELSE response_body END,
    body_omitted = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN FALSE ELSE body_omitted END,
    completed_at = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN NULL ELSE completed_at END,
    expires_at = CASE WHEN (owner = ?
              OR expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)
              OR (status = 'processing' AND fingerprint = COALESCE(?, X'') AND lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)))
        THEN (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ? + ? ELSE expires_at END;

-- name: begin
-- send: text
START TRANSACTION;

-- name: reserveStock
-- shopd: prepare each time
-- params: quantity sku quantity
-- affected: 1
UPDATE shop_products SET stock = stock - ? WHERE sku = ? AND stock >= ?;

-- name: productPrice
-- shopd: prepare each time
-- params: sku
-- rows: 1
SELECT price_cents FROM shop_products WHERE sku = ?;

-- name: insertOrder
-- shopd: prepare each time
-- params: order_no user_id sku quantity amount_cents coupon_id reserved_qty status created_at
-- affected: 1
INSERT INTO shop_orders (order_no, user_id, sku, quantity, amount_cents, coupon_id, reserved_qty, status, version, created_at, created_ms, updated_ms)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000), (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000));

-- name: complete
-- shopd: prepare each time
-- params: response_status response_header response_body body_omitted retention_ms retention_ms scope key owner fence
-- affected: 1
UPDATE idem_records SET
    status          = 'completed',
    response_status = ?,
    response_header = ?,
    response_body   = ?,
    body_omitted    = ?,
    retention_ms    = ?,
    completed_at    = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000),
    expires_at      = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000) + ?
WHERE scope = COALESCE(?, X'') AND idempotency_key = ?
  AND status = 'processing' AND owner = ? AND fence = ?;

-- name: commit
-- send: text
COMMIT;
