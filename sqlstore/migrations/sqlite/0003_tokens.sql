-- idem_tokens holds the pre-issued submit tokens of package token
-- (TokenStore), one row per token. A token is kept by its digest
-- (token.Digest: the SHA-256 of its ID, in hex), never by its ID, so a
-- reader of the table cannot present a token found there. Times are unix
-- milliseconds on the database's clock. used_at is NULL until the token is
-- spent; result is what its first use attached (NULL for none). A row
-- lives until expires_at, used or not, and then until a sweep. Text is
-- compared byte for byte (the BINARY collation).
CREATE TABLE idem_tokens (
    digest     TEXT    NOT NULL PRIMARY KEY,
    scope      TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    used_at    INTEGER,
    result     BLOB
) STRICT;

-- TokenStore.Sweep deletes by expires_at.
CREATE INDEX idem_tokens_expires_at ON idem_tokens (expires_at);
