-- took_over says whether the processing record's current lease replaced
-- another processing record (a takeover of an ended lease, or the
-- replacement of a record abandoned past its expiry): Acquire reports it
-- as AcquireResult.TookOver. created_at cannot tell it any more, since
-- the replacement of an expired record is a new record, created then.
-- It means nothing once the record is completed.
ALTER TABLE idem_records ADD COLUMN took_over INTEGER NOT NULL DEFAULT 0 CHECK (took_over IN (0, 1));
