-- Sweep removes failed records and abandoned processing ones too: every
-- record last updated more than the retention ago, but a processing one
-- whose lease is live or ended less than the retention ago. The index on
-- updated_at serves that range for every status (a processing record was
-- last updated by its claim, before its lease ended); it replaces the
-- partial index of succeeded and dead records.
CREATE INDEX idem_inbox_updated ON idem_inbox (updated_at);
DROP INDEX idem_inbox_finished;
