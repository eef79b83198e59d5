-- Version 2: products and stock, coupons, payments, reconciliation,
-- refunds, and the order's amount, version and lifecycle columns. Times
-- the shop compares are unix milliseconds (created_ms); orders of version
-- 1 keep 0 there and reserved no stock (reserved_qty 0).
CREATE TABLE IF NOT EXISTS shop_meta (
    name  text PRIMARY KEY,
    value text NOT NULL
);
CREATE TABLE IF NOT EXISTS shop_products (
    sku         text   PRIMARY KEY,
    name        text   NOT NULL,
    price_cents bigint NOT NULL CHECK (price_cents >= 0),
    stock       bigint NOT NULL CHECK (stock >= 0)
);
CREATE TABLE IF NOT EXISTS shop_coupons (
    id             bigint PRIMARY KEY,
    name           text   NOT NULL,
    discount_cents bigint NOT NULL CHECK (discount_cents > 0),
    total          bigint NOT NULL CHECK (total >= 0),
    claimed        bigint NOT NULL DEFAULT 0 CHECK (claimed >= 0 AND claimed <= total)
);
CREATE TABLE IF NOT EXISTS shop_coupon_claims (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    coupon_id  bigint NOT NULL REFERENCES shop_coupons (id),
    user_id    bigint NOT NULL,
    status     text   NOT NULL,
    order_no   text,
    version    bigint NOT NULL DEFAULT 1,
    claimed_ms bigint NOT NULL,
    UNIQUE (user_id, coupon_id)
);
ALTER TABLE shop_orders ADD COLUMN IF NOT EXISTS amount_cents bigint NOT NULL DEFAULT 0;
ALTER TABLE shop_orders ADD COLUMN IF NOT EXISTS coupon_id bigint;
ALTER TABLE shop_orders ADD COLUMN IF NOT EXISTS reserved_qty bigint NOT NULL DEFAULT 0;
ALTER TABLE shop_orders ADD COLUMN IF NOT EXISTS version bigint NOT NULL DEFAULT 1;
ALTER TABLE shop_orders ADD COLUMN IF NOT EXISTS created_ms bigint NOT NULL DEFAULT 0;
ALTER TABLE shop_orders ADD COLUMN IF NOT EXISTS updated_ms bigint NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS shop_orders_status_created ON shop_orders (status, created_ms);
CREATE TABLE IF NOT EXISTS shop_payments (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    trade_no     text   NOT NULL UNIQUE,
    order_no     text   NOT NULL,
    amount_cents bigint NOT NULL,
    created_ms   bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS shop_reconciliations (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    trade_no     text   NOT NULL UNIQUE,
    order_no     text   NOT NULL,
    amount_cents bigint NOT NULL,
    reason       text   NOT NULL,
    created_ms   bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS shop_refunds (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    refund_no    text   NOT NULL UNIQUE,
    order_no     text   NOT NULL UNIQUE,
    amount_cents bigint NOT NULL,
    status       text   NOT NULL,
    created_ms   bigint NOT NULL
);
