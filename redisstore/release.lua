-- release.lua deletes the processing record held by owner and fence.
-- KEYS[1]: the record. ARGV: owner, fence.
-- Returns 0, or the reason the lease is lost (see held).
local key = KEYS[1]
local _, lost = held(key, ARGV[1], ARGV[2])
if lost then
  return lost
end
redis.call('DEL', key)
return 0
