-- Version 4: shop_points, the loyalty ledger. The loyalty consumer writes
-- one row per order event it handles (order.paid grants points,
-- order.refunded takes them back), in the transaction of its inbox
-- record; (order_no, event) is unique, so an event counts once even if it
-- were delivered under two message ids. A user's balance is the sum of
-- their rows. at_ms is the event's time, in unix milliseconds.
CREATE TABLE IF NOT EXISTS shop_points (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id  bigint NOT NULL,
    order_no text   NOT NULL,
    event    text   NOT NULL,
    points   bigint NOT NULL,
    at_ms    bigint NOT NULL,
    UNIQUE (order_no, event)
);
CREATE INDEX IF NOT EXISTS shop_points_user ON shop_points (user_id, id);
