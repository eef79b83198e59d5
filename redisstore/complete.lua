-- complete.lua stores the response and marks the record completed.
-- KEYS[1]: the record. ARGV: owner, fence, retention ms, grace ms, status
-- code, encoded header, body, omitted (0/1).
-- Returns 0, or the reason the lease is lost (see held). A record already
-- completed with this owner and fence was completed by an earlier call of
-- this lease (a retry after its reply was lost): 0, and the record, first
-- response and TTL included, stays as it is.
local key = KEYS[1]
local r, lost = held(key, ARGV[1], ARGV[2])
if lost then
  if lost == 2 and r[1] == 'completed' and r[2] == ARGV[1] and r[3] == ARGV[2] then
    return 0
  end
  return lost
end
local now = now_ms()
local retention = tonumber(ARGV[3])
local expires = now + retention
redis.call('HSET', key, 'status', 'completed', 'completed_at', int(now), 'retention', int(retention),
  'expires_at', int(expires), 'code', ARGV[5], 'header', ARGV[6], 'body', ARGV[7], 'omitted', ARGV[8])
expire_at(key, expires, tonumber(ARGV[4]))
return 0
