-- inbox_end.lua ends the attempt of fence ARGV[1] on the consume record
-- at KEYS[1] (see inbox_claim.lua), if it is processing with that fence.
-- ARGV: fence, op ("finish", "fail" or "extend"), then for finish: the
-- retention in ms; for fail: max_attempts, reason, retention ms; for
-- extend: lease_ms (the lease must not have ended).
-- A succeeded or dead record gets the retention as its TTL; a processing
-- or failed one has none (a volatile-* eviction policy cannot drop it).
-- Returns 0: fenced out; otherwise the new status (extend: 'processing').
local key = KEYS[1]
local r = redis.call('HMGET', key, 's', 'f', 'a', 'l')
if r[1] ~= 'processing' or r[2] ~= ARGV[1] then
  return 0
end
local now = now_ms()
local op = ARGV[2]
if op == 'finish' then
  redis.call('HSET', key, 's', 'succeeded', 'u', int(now))
  redis.call('PEXPIRE', key, ARGV[3])
  return 'succeeded'
elseif op == 'fail' then
  local s = 'failed'
  if tonumber(r[3]) >= tonumber(ARGV[3]) then
    s = 'dead'
  end
  redis.call('HSET', key, 's', s, 'e', ARGV[4], 'l', int(now), 'u', int(now))
  if s == 'dead' then
    redis.call('PEXPIRE', key, ARGV[5])
  end
  return s
end
if tonumber(r[4]) <= now then
  return 0
end
redis.call('HSET', key, 'l', int(now + tonumber(ARGV[3])))
return 'processing'
