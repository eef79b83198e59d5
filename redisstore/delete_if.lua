-- delete_if.lua deletes the record, whatever its state, if it still has
-- owner and fence: the record an operator read.
-- KEYS[1]: the record. ARGV: owner, fence.
-- Returns 0 (deleted), 1 (no record), or the record's fence (as a string)
-- when it has another owner or fence.
local key = KEYS[1]
local r = redis.call('HMGET', key, 'owner', 'fence')
if not r[1] then
  return 1
end
if r[1] ~= ARGV[1] or r[2] ~= ARGV[2] then
  return {r[2]}
end
redis.call('DEL', key)
return 0
