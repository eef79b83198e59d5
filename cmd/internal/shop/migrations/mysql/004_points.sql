-- Version 4: shop_points, the loyalty ledger. The loyalty consumer writes
-- one row per order event it handles (order.paid grants points,
-- order.refunded takes them back), in the transaction of its inbox
-- record; (order_no, event) is unique, so an event counts once even if it
-- were delivered under two message ids. A user's balance is the sum of
-- their rows. at_ms is the event's time, in unix milliseconds.
CREATE TABLE IF NOT EXISTS shop_points (
    id       BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    user_id  BIGINT      NOT NULL,
    order_no VARCHAR(64) NOT NULL,
    event    VARCHAR(32) NOT NULL,
    points   BIGINT      NOT NULL,
    at_ms    BIGINT      NOT NULL,
    UNIQUE KEY shop_points_event (order_no, event),
    KEY shop_points_user (user_id, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
