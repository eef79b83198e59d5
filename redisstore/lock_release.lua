-- lock_release.lua frees a lock held by the caller (compare-and-delete).
-- The fence counter stays.
-- KEYS[1]: the lock (see lock_acquire.lua). ARGV: owner, fence.
-- Returns 1, or 0 if the lock is not held by (owner, fence): another
-- owner's, released, or past the end of its lease.
local now = now_ms()
local t = redis.call('HMGET', KEYS[1], 'o', 'f', 'u')
if t[1] ~= ARGV[1] or t[2] ~= ARGV[2] or not t[3] or tonumber(t[3]) <= now then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
