-- token_insert.lua stores a new, unused token of package token.
-- KEYS[1]: the token (PREFIX:token:{SCOPETAG}:DIGEST); KEYS[2]: the set of
-- the scope's unused tokens (PREFIX:tokens:{SCOPETAG}:SCOPE), same slot. ARGV:
-- scope, ttl (ms), digest.
-- A token is a hash: s (its scope), then, once spent, u (when, unix ms on
-- the server's clock), r (the result of the first use, absent for none)
-- and f (the fingerprint of its request, absent for none). Its key
-- expires at the server's now + ttl, and at the use, later if the use
-- keeps it longer. The set scores each unused token by its expiry (unix
-- ms); it lives as long as its latest token.
-- ARGV[4] is a random token of this call, kept in the hash (i, with the
-- expiry e): a client that sends the script again after its reply was
-- lost, as go-redis does, finds its own insert and gets its expiry rather
-- than "duplicate".
-- Returns the expiry (unix ms), or -1 if the key exists.
local key, set = KEYS[1], KEYS[2]
if redis.call('EXISTS', key) == 1 then
  local mine = redis.call('HMGET', key, 'i', 'e')
  if mine[1] == ARGV[4] and mine[2] then
    return tonumber(mine[2])
  end
  return -1
end
local expires_at = now_ms() + tonumber(ARGV[2])
redis.call('HSET', key, 's', ARGV[1], 'i', ARGV[4], 'e', int(expires_at))
redis.call('PEXPIREAT', key, int(expires_at))
redis.call('ZADD', set, int(expires_at), ARGV[3])
local pttl = redis.call('PTTL', set)
if pttl < 0 or pttl < tonumber(ARGV[2]) then
  redis.call('PEXPIREAT', set, int(expires_at))
end
return expires_at
