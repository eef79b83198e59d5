-- Version 6: shop_shipments, the shipment a card checkout booked at the
-- carrier (POST /orders/{order_no}/card-checkout), one per order, with
-- the carrier's shipment id and tracking number.
CREATE TABLE IF NOT EXISTS shop_shipments (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    order_no        TEXT NOT NULL UNIQUE,
    shipment_id     TEXT NOT NULL,
    tracking_number TEXT NOT NULL,
    address         TEXT NOT NULL,
    created_ms      INTEGER NOT NULL
);
