-- Version 6: shop_shipments, the shipment a card checkout booked at the
-- carrier (POST /orders/{order_no}/card-checkout), one per order, with
-- the carrier's shipment id and tracking number.
CREATE TABLE IF NOT EXISTS shop_shipments (
    id              BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    order_no        VARCHAR(64)  NOT NULL,
    shipment_id     VARCHAR(64)  NOT NULL,
    tracking_number VARCHAR(64)  NOT NULL,
    address         VARCHAR(512) NOT NULL,
    created_ms      BIGINT       NOT NULL,
    UNIQUE KEY shop_shipments_order_no (order_no)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
