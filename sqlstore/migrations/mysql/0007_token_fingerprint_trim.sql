-- fingerprint is the SHA-256 (lowercase hex) of the request the token's
-- first use presented (token.Use.Request), NULL for none or while unused:
-- package token refuses a later use with a different request. The index
-- serves TokenStore.Trim, which keeps the newest unused tokens of a scope
-- (by expires_at) and removes the others. Rows of earlier versions have
-- no fingerprint, and are not checked.
--
-- One ALTER, run only when the column is missing (MySQL 8 has no ADD
-- COLUMN IF NOT EXISTS), so that a rerun after an interruption is
-- harmless.
SET @idem_ddl = (
    SELECT IF(count(*) = 0,
        'ALTER TABLE idem_tokens ADD COLUMN fingerprint VARBINARY(64) NULL, ADD INDEX idem_tokens_scope_expires_at (scope, expires_at)',
        'DO 0')
    FROM information_schema.columns
    WHERE table_schema = DATABASE() AND table_name = 'idem_tokens' AND column_name = 'fingerprint');
PREPARE idem_ddl FROM @idem_ddl;
EXECUTE idem_ddl;
DEALLOCATE PREPARE idem_ddl;
SET @idem_ddl = NULL;
