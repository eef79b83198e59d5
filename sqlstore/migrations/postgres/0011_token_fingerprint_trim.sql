-- fingerprint is the SHA-256 (lowercase hex) of the request the token's
-- first use presented (token.Use.Request), NULL for none or while unused:
-- package token refuses a later use with a different request. The index
-- serves TokenStore.Trim, which keeps the newest unused tokens of a scope
-- (by expires_at) and removes the others; it holds unused tokens only, so
-- a scope's used tokens (kept a day after their use) cost a trim nothing. Rows of earlier versions have
-- no fingerprint, and are not checked.
ALTER TABLE idem_tokens ADD COLUMN fingerprint text;
CREATE INDEX idem_tokens_scope_expires_at ON idem_tokens (scope, expires_at) WHERE used_at IS NULL;
