-- sweep.lua deletes the record if it is past its expires_at and is not a
-- processing record with a live lease: an expired completed record, or a
-- processing one abandoned for its retention (processing records have no
-- TTL, so nothing else removes those but an Acquire of their key).
-- KEYS[1]: the record. Returns 1 if it deleted it, else 0.
local key = KEYS[1]
local r = redis.call('HMGET', key, 'status', 'lease_until', 'expires_at')
if not r[1] or not r[3] then
  return 0
end
local now = now_ms()
if now < tonumber(r[3]) then
  return 0
end
if r[1] == 'processing' and now < tonumber(r[2]) then
  return 0
end
redis.call('DEL', key)
return 1
