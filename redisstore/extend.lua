-- extend.lua moves the lease's end to now + ttl.
-- KEYS[1]: the record. ARGV: owner, fence, ttl ms.
-- Returns {0, lease_until}, or {the reason the lease is lost (see held)}.
local key = KEYS[1]
local r, lost = held(key, ARGV[1], ARGV[2], 'retention')
if lost then
  return {lost}
end
local lease_until = now_ms() + tonumber(ARGV[3])
local expires = lease_until + tonumber(r[4])
redis.call('HSET', key, 'lease_until', int(lease_until), 'expires_at', int(expires))
-- A processing record has no TTL (see acquire.lua); records written by
-- earlier versions of the store carry one.
redis.call('PERSIST', key)
return {0, lease_until}
