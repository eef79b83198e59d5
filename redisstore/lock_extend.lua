-- lock_extend.lua extends a lease held by the caller (compare-and-extend).
-- KEYS[1]: the lock. ARGV: owner, fence, lease ms.
-- Returns 1, or 0 if the lock is not held by (owner, fence): another
-- owner's, released, or expired.
if redis.call('GET', KEYS[1]) ~= ARGV[2] .. ':' .. ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
