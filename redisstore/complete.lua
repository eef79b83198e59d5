-- complete.lua stores the response and marks the record completed.
-- KEYS[1]: the record. ARGV: owner, fence, retention ms, grace ms, status
-- code, encoded header, body, omitted (0/1).
-- Returns 0, or the reason the lease is lost (see held).
local key = KEYS[1]
local _, lost = held(key, ARGV[1], ARGV[2])
if lost then
  return lost
end
local now = now_ms()
local retention = tonumber(ARGV[3])
local expires = now + retention
redis.call('HSET', key, 'status', 'completed', 'completed_at', int(now), 'retention', int(retention),
  'expires_at', int(expires), 'code', ARGV[5], 'header', ARGV[6], 'body', ARGV[7], 'omitted', ARGV[8])
expire_at(key, expires, tonumber(ARGV[4]))
return 0
