-- token_insert.lua stores a new, unused token of package token.
-- KEYS[1]: the token (PREFIX:token:DIGEST). ARGV: scope, ttl (ms).
-- A token is a hash: s (its scope), then, once spent, u (when, unix ms on
-- the server's clock) and r (the result of the first use, absent for
-- none). Its key expires at the server's now + ttl, used or not.
-- Returns the expiry (unix ms), or -1 if the key exists.
local key = KEYS[1]
if redis.call('EXISTS', key) == 1 then
  return -1
end
local expires_at = now_ms() + tonumber(ARGV[2])
redis.call('HSET', key, 's', ARGV[1])
redis.call('PEXPIREAT', key, int(expires_at))
return expires_at
