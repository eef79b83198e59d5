-- Version 5: refunds go through the payment provider, as an operation of
-- steps (package steps). A refund row is REFUNDING from the order's
-- PAID → REFUNDING until the provider answers, then REFUNDED with the
-- provider's refund id (provider_refund_id); a refund the provider
-- refuses is deleted with the order's REFUNDING → PAID. Rows of earlier
-- versions were refunded locally and keep a NULL provider_refund_id.
ALTER TABLE shop_refunds ADD COLUMN provider_refund_id VARCHAR(64) NULL;
