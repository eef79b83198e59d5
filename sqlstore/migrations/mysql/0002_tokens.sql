-- idem_tokens holds the pre-issued submit tokens of package token
-- (TokenStore), one row per token. A token is kept by its digest
-- (token.Digest: the SHA-256 of its ID, in hex), never by its ID, so a
-- reader of the table cannot present a token found there. Times are unix
-- milliseconds on the database's clock. used_at is NULL until the token is
-- spent; result is what its first use attached (NULL for none; at most
-- token.MaxResultLen, 16 KiB, within a BLOB's 64 KiB). A row lives until
-- expires_at, used or not, and then until a sweep.
--
-- digest and scope are VARBINARY, compared byte for byte (a _bin text
-- collation pads spaces: 'u' and 'u ' would be one scope). The table and
-- its index are one statement, and IF NOT EXISTS makes a rerun after an
-- interruption harmless (MySQL commits DDL statement by statement).
CREATE TABLE IF NOT EXISTS idem_tokens (
    digest     VARBINARY(64)  NOT NULL,
    scope      VARBINARY(255) NOT NULL,
    created_at BIGINT         NOT NULL,
    expires_at BIGINT         NOT NULL,
    used_at    BIGINT         NULL,
    result     BLOB           NULL,
    PRIMARY KEY (digest),
    INDEX idem_tokens_expires_at (expires_at)
) ENGINE = InnoDB;
