-- inbox_claim.lua claims the consume record of package inbox at KEYS[1]
-- (a hash: s status, a attempts, f fence, l lease_until, e last error,
-- c created_at, u updated_at; times in unix ms on the server's clock).
-- ARGV: lease_ms, max_attempts.
-- A new record, a failed one or a processing one whose lease has ended
-- becomes processing with attempts + 1 and fence + 1; a processing one
-- whose lease ended after max_attempts attempts becomes dead (its TTL:
-- ARGV[3], the retention in ms). Others are left as they are.
-- Returns {claimed (0/1), status, attempts, fence, lease_until, now}.
local key = KEYS[1]
local now = now_ms()
local r = redis.call('HMGET', key, 's', 'a', 'f', 'l')
local s, a, f, l = r[1], tonumber(r[2] or '0'), tonumber(r[3] or '0'), tonumber(r[4] or '0')
local expired = s == 'processing' and l <= now
if s and s ~= 'failed' and not expired then
  return {0, s, a, f, l, now}
end
if expired and a >= tonumber(ARGV[2]) then
  redis.call('HSET', key, 's', 'dead', 'u', int(now))
  redis.call('PEXPIRE', key, ARGV[3])
  return {0, 'dead', a, f, l, now}
end
l = now + tonumber(ARGV[1])
if not s then
  redis.call('HSET', key, 'c', int(now))
end
redis.call('HSET', key, 's', 'processing', 'a', int(a + 1), 'f', int(f + 1), 'l', int(l), 'u', int(now))
return {1, 'processing', a + 1, f + 1, l, now}
