-- MySQL commits each DDL statement by itself: the index lives inside the
-- CREATE TABLE so that a rerun after an interruption is harmless.
CREATE TABLE IF NOT EXISTS shop_orders (
    id         BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    order_no   VARCHAR(64) NOT NULL,
    user_id    BIGINT      NOT NULL,
    sku        VARCHAR(64) NOT NULL,
    quantity   INT         NOT NULL CHECK (quantity > 0),
    status     VARCHAR(16) NOT NULL,
    created_at VARCHAR(40) NOT NULL,
    UNIQUE KEY shop_orders_order_no (order_no),
    KEY shop_orders_user (user_id, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
