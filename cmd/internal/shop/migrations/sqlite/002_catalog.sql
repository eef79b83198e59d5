-- Version 2: products and stock, coupons, payments, reconciliation,
-- refunds, and the order's amount, version and lifecycle columns. Times
-- the shop compares are unix milliseconds (created_ms); orders of version
-- 1 keep 0 there and reserved no stock (reserved_qty 0).
CREATE TABLE IF NOT EXISTS shop_meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS shop_products (
    sku         TEXT    PRIMARY KEY,
    name        TEXT    NOT NULL,
    price_cents INTEGER NOT NULL CHECK (price_cents >= 0),
    stock       INTEGER NOT NULL CHECK (stock >= 0)
);
CREATE TABLE IF NOT EXISTS shop_coupons (
    id             INTEGER PRIMARY KEY,
    name           TEXT    NOT NULL,
    discount_cents INTEGER NOT NULL CHECK (discount_cents > 0),
    total          INTEGER NOT NULL CHECK (total >= 0),
    claimed        INTEGER NOT NULL DEFAULT 0 CHECK (claimed >= 0 AND claimed <= total)
);
CREATE TABLE IF NOT EXISTS shop_coupon_claims (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    coupon_id  INTEGER NOT NULL REFERENCES shop_coupons (id),
    user_id    INTEGER NOT NULL,
    status     TEXT    NOT NULL,
    order_no   TEXT,
    version    INTEGER NOT NULL DEFAULT 1,
    claimed_ms INTEGER NOT NULL,
    UNIQUE (user_id, coupon_id)
);
ALTER TABLE shop_orders ADD COLUMN amount_cents INTEGER NOT NULL DEFAULT 0;
ALTER TABLE shop_orders ADD COLUMN coupon_id INTEGER;
ALTER TABLE shop_orders ADD COLUMN reserved_qty INTEGER NOT NULL DEFAULT 0;
ALTER TABLE shop_orders ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
ALTER TABLE shop_orders ADD COLUMN created_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE shop_orders ADD COLUMN updated_ms INTEGER NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS shop_orders_status_created ON shop_orders (status, created_ms);
CREATE TABLE IF NOT EXISTS shop_payments (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    trade_no     TEXT    NOT NULL UNIQUE,
    order_no     TEXT    NOT NULL,
    amount_cents INTEGER NOT NULL,
    created_ms   INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS shop_reconciliations (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    trade_no     TEXT    NOT NULL UNIQUE,
    order_no     TEXT    NOT NULL,
    amount_cents INTEGER NOT NULL,
    reason       TEXT    NOT NULL,
    created_ms   INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS shop_refunds (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    refund_no    TEXT    NOT NULL UNIQUE,
    order_no     TEXT    NOT NULL UNIQUE,
    amount_cents INTEGER NOT NULL,
    status       TEXT    NOT NULL,
    created_ms   INTEGER NOT NULL
);
