-- inbox_sweep.lua deletes the consume record at KEYS[1] (see
-- inbox_claim.lua) if no delivery works on it any more: a succeeded,
-- failed or dead record last updated more than ARGV[1] ms (the retention)
-- ago, or a processing one whose lease ended more than ARGV[1] ms ago.
-- Returns 1 if it deleted the record, else 0.
local key = KEYS[1]
local r = redis.call('HMGET', key, 's', 'l', 'u')
if not r[1] then
  return 0
end
local last = tonumber(r[3])
if r[1] == 'processing' then
  last = tonumber(r[2])
end
if not last or last > now_ms() - tonumber(ARGV[1]) then
  return 0
end
redis.call('DEL', key)
return 1
