CREATE TABLE IF NOT EXISTS shop_orders (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    order_no   TEXT    NOT NULL UNIQUE,
    user_id    INTEGER NOT NULL,
    sku        TEXT    NOT NULL,
    quantity   INTEGER NOT NULL CHECK (quantity > 0),
    status     TEXT    NOT NULL,
    created_at TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS shop_orders_user ON shop_orders (user_id, id);
