CREATE TABLE IF NOT EXISTS shop_orders (
    id         bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_no   text    NOT NULL UNIQUE,
    user_id    bigint  NOT NULL,
    sku        text    NOT NULL,
    quantity   integer NOT NULL CHECK (quantity > 0),
    status     text    NOT NULL,
    created_at text    NOT NULL
);
CREATE INDEX IF NOT EXISTS shop_orders_user ON shop_orders (user_id, id);
