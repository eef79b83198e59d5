-- pgbench script of bench/service/run: the floor of one shopd order, the
-- statements shopd sends for POST /orders, straight against the same
-- database (its tables, migrations and functions), without HTTP, Go or
-- database/sql.
--
--   pgbench -n -M prepared -c 16 -j 2 -T 6 -f floor_postgres.sql DB
--
-- What one order sends, as log_statement=all shows it for shopd on
-- PostgreSQL 15 (pgx through database/sql; every statement prepared once
-- per connection, then Bind/Execute/Sync: one round trip each):
--
--   1. acquire      (sqlstore/queries/postgres.sql, autocommit: its own
--                    transaction, which idem_acquire_write's INSERT of
--                    the processing record commits)
--   2. BEGIN        (simple query)
--   3. reserveStock (cmd/internal/shop/shop.go)
--   4. productPrice
--   5. insertOrder
--   6. complete     (sqlstore/queries/postgres.sql, run by CompleteTx in
--                    the order's transaction, as an Exec: its RETURNING
--                    row is not read)
--   7. COMMIT       (simple query)
--
-- This script sends the same seven, in prepared mode. The parameters
-- shopd binds are written here as expressions of pgbench variables
-- (scope 'user:N', a key unique per transaction, order numbers
-- 'ord_…') or as constants of the same size as shopd's (fingerprint,
-- owner, the stored 201 answer's header and ~180-byte body). The record
-- is new, so its fence is 1. What shopd adds per order beyond these
-- (nothing in this version, apart from the outbox relay's poll every
-- 0.5 s, which is not per order) is not here.

\set uid random(1, 1000)
\set sku random(100, 199)
\set k random(1, 9000000000000000000)

-- 1. acquire: scope, key, fingerprint, owner, lease_ms, retention_ms.
WITH held AS (
    SELECT took_over, scope, idempotency_key, fingerprint, status, owner, fence,
           lease_until, retention_ms, response_status, response_header,
           response_body, body_omitted, created_at, completed_at, expires_at
    FROM idem_records_renewed
    WHERE scope = ('user:' || :uid) AND idempotency_key = ('floor-' || :client_id || '-' || :k)
      AND expires_at > floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint
      AND (status = 'completed' OR fingerprint <> 'v1:433b9e89ff43c7b2c73d2eecd6e94fed9bee838c406be8442d7e143a98cee55c' OR lease_until > floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint))
SELECT took_over, scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM held
UNION ALL
SELECT took_over, scope, idempotency_key, fingerprint, status, owner, fence,
       lease_until, retention_ms, response_status, response_header,
       response_body, body_omitted, created_at, completed_at, expires_at
FROM idem_acquire_write(('user:' || :uid)::text, ('floor-' || :client_id || '-' || :k)::text,
     'v1:433b9e89ff43c7b2c73d2eecd6e94fed9bee838c406be8442d7e143a98cee55c'::text,
     '89c2407a9b639cb4b75de411c82ec945'::text, 30000::bigint, 86400000::bigint)
WHERE NOT EXISTS (SELECT 1 FROM held);

-- 2. The order's transaction.
BEGIN;

-- 3. reserveStock: quantity, sku, quantity.
UPDATE shop_products SET stock = stock - 1 WHERE sku = ('SKU-' || :sku) AND stock >= 1;

-- 4. productPrice: sku.
SELECT price_cents FROM shop_products WHERE sku = ('SKU-' || :sku);

-- 5. insertOrder: order_no, user_id, sku, quantity, amount_cents,
-- coupon_id (NULL), reserved_qty, status, created_at.
INSERT INTO shop_orders (order_no, user_id, sku, quantity, amount_cents, coupon_id, reserved_qty, status, version, created_at, created_ms, updated_ms)
    VALUES ('ord_' || :client_id || '_' || :k, :uid, 'SKU-' || :sku, 1, 100 + :sku, NULL, 1, 'WAIT_PAY', 1, '2026-12-02T17:44:25.72359659Z',
    floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint, floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint);

-- 6. complete: scope, key, owner, fence, response_status,
-- response_header, response_body, body_omitted, retention_ms.
UPDATE idem_records SET
    status          = 'completed',
    response_status = 201,
    response_header = '{"Content-Type":["application/json"],"Location":["/orders/ord_80717a8769fb24dc17b6ca4f"]}',
    response_body   = '{"order_no":"ord_80717a8769fb24dc17b6ca4f","user_id":1,"sku":"SKU-007","quantity":1,"amount_cents":107,"status":"WAIT_PAY","version":1,"created_at":"2026-12-02T17:44:25.72359659Z"}'::bytea,
    body_omitted    = false,
    retention_ms    = 86400000,
    completed_at    = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint,
    expires_at      = floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint + 86400000
WHERE scope = ('user:' || :uid) AND idempotency_key = ('floor-' || :client_id || '-' || :k)
  AND status = 'processing' AND owner = '89c2407a9b639cb4b75de411c82ec945' AND fence = 1
RETURNING fingerprint, lease_until, created_at, completed_at, expires_at;

-- 7.
COMMIT;
