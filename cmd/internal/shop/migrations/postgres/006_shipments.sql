-- Version 6: shop_shipments, the shipment a card checkout booked at the
-- carrier (POST /orders/{order_no}/card-checkout), one per order, with
-- the carrier's shipment id and tracking number.
CREATE TABLE IF NOT EXISTS shop_shipments (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_no        text NOT NULL UNIQUE,
    shipment_id     text NOT NULL,
    tracking_number text NOT NULL,
    address         text NOT NULL,
    created_ms      bigint NOT NULL
);
