-- lock_acquire.lua takes a lock if it is free.
-- KEYS[1]: the lock (a string "FENCE:OWNER" with the lease as its TTL),
-- KEYS[2]: the name's fence counter (no TTL; same hash slot).
-- ARGV: owner, lease ms.
-- Returns the new fence, or 0 if another owner holds the lock.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local fence = redis.call('INCR', KEYS[2])
-- %d: Lua's own conversion of a number would turn to an exponent past 1e14.
redis.call('SET', KEYS[1], string.format('%d', fence) .. ':' .. ARGV[1], 'PX', ARGV[2])
return fence
