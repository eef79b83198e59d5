-- lock_release.lua frees a lock held by the caller (compare-and-delete).
-- The fence counter stays.
-- KEYS[1]: the lock. ARGV: owner, fence.
-- Returns 1, or 0 if the lock is not held by (owner, fence).
if redis.call('GET', KEYS[1]) ~= ARGV[2] .. ':' .. ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
