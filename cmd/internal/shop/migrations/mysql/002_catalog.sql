-- Version 2: products and stock, coupons, payments, reconciliation,
-- refunds, and the order's amount, version and lifecycle columns. Times
-- the shop compares are unix milliseconds (created_ms); orders of version
-- 1 keep 0 there and reserved no stock (reserved_qty 0). MySQL commits
-- each DDL statement by itself, so each statement is safe to rerun
-- (MariaDB's ADD COLUMN IF NOT EXISTS; indexes inside CREATE TABLE or
-- CREATE INDEX IF NOT EXISTS).
CREATE TABLE IF NOT EXISTS shop_meta (
    name  VARCHAR(64)  NOT NULL PRIMARY KEY,
    value VARCHAR(255) NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TABLE IF NOT EXISTS shop_products (
    sku         VARCHAR(64)  NOT NULL PRIMARY KEY,
    name        VARCHAR(200) NOT NULL,
    price_cents BIGINT       NOT NULL CHECK (price_cents >= 0),
    stock       BIGINT       NOT NULL CHECK (stock >= 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TABLE IF NOT EXISTS shop_coupons (
    id             BIGINT       NOT NULL PRIMARY KEY,
    name           VARCHAR(200) NOT NULL,
    discount_cents BIGINT       NOT NULL CHECK (discount_cents > 0),
    total          BIGINT       NOT NULL CHECK (total >= 0),
    claimed        BIGINT       NOT NULL DEFAULT 0 CHECK (claimed >= 0 AND claimed <= total)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TABLE IF NOT EXISTS shop_coupon_claims (
    id         BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    coupon_id  BIGINT      NOT NULL,
    user_id    BIGINT      NOT NULL,
    status     VARCHAR(16) NOT NULL,
    order_no   VARCHAR(64),
    version    BIGINT      NOT NULL DEFAULT 1,
    claimed_ms BIGINT      NOT NULL,
    UNIQUE KEY shop_coupon_claims_user_coupon (user_id, coupon_id),
    CONSTRAINT shop_coupon_claims_coupon FOREIGN KEY (coupon_id) REFERENCES shop_coupons (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
ALTER TABLE shop_orders ADD COLUMN IF NOT EXISTS amount_cents BIGINT NOT NULL DEFAULT 0;
ALTER TABLE shop_orders ADD COLUMN IF NOT EXISTS coupon_id BIGINT;
ALTER TABLE shop_orders ADD COLUMN IF NOT EXISTS reserved_qty BIGINT NOT NULL DEFAULT 0;
ALTER TABLE shop_orders ADD COLUMN IF NOT EXISTS version BIGINT NOT NULL DEFAULT 1;
ALTER TABLE shop_orders ADD COLUMN IF NOT EXISTS created_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE shop_orders ADD COLUMN IF NOT EXISTS updated_ms BIGINT NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS shop_orders_status_created ON shop_orders (status, created_ms);
CREATE TABLE IF NOT EXISTS shop_payments (
    id           BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    trade_no     VARCHAR(64) NOT NULL,
    order_no     VARCHAR(64) NOT NULL,
    amount_cents BIGINT      NOT NULL,
    created_ms   BIGINT      NOT NULL,
    UNIQUE KEY shop_payments_trade_no (trade_no)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TABLE IF NOT EXISTS shop_reconciliations (
    id           BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    trade_no     VARCHAR(64) NOT NULL,
    order_no     VARCHAR(64) NOT NULL,
    amount_cents BIGINT      NOT NULL,
    reason       VARCHAR(32) NOT NULL,
    created_ms   BIGINT      NOT NULL,
    UNIQUE KEY shop_reconciliations_trade_no (trade_no)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TABLE IF NOT EXISTS shop_refunds (
    id           BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    refund_no    VARCHAR(64) NOT NULL,
    order_no     VARCHAR(64) NOT NULL,
    amount_cents BIGINT      NOT NULL,
    status       VARCHAR(16) NOT NULL,
    created_ms   BIGINT      NOT NULL,
    UNIQUE KEY shop_refunds_refund_no (refund_no),
    UNIQUE KEY shop_refunds_order_no (order_no)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
