-- lock_acquire.lua takes a lock if it is free.
-- KEYS[1]: the lock, a hash with no TTL: o (owner), f (fence), u (the end
-- of the lease, unix ms on the server's clock). Without a TTL, Redis does
-- not evict it under a volatile-* maxmemory policy.
-- KEYS[2]: the name's fence counter (no TTL; same hash slot).
-- ARGV: owner, lease ms.
-- Returns the new fence (or, to the same owner sent again, the fence it
-- holds), or 0 if another owner holds the lock.
-- The lease ends at now + lease + 1: now is truncated to the millisecond,
-- so the lease never ends before the lease ms have passed since the script
-- began.
local now = now_ms()
local held = redis.call('HMGET', KEYS[1], 'o', 'f', 'u')
if held[3] and tonumber(held[3]) > now then
  if held[1] == ARGV[1] then
    -- Ours already: the owner is this acquisition's random token, so this
    -- is the script again (go-redis sends it again when its reply was
    -- lost). Answer the fence the first run took.
    return tonumber(held[2])
  end
  return 0
end
local fence = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'o', ARGV[1], 'f', int(fence), 'u', int(now + tonumber(ARGV[2]) + 1))
return fence
