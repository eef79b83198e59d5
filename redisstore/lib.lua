-- lib.lua is prepended to every script of the package.
--
-- A record is one hash. Its fields: status ("processing" or "completed"),
-- fp, owner, fence, lease_until, retention, created_at, completed_at,
-- expires_at, code, header, body, omitted. Times are unix milliseconds on
-- the server's clock (TIME); retention is milliseconds.

-- now_ms is the server's clock in whole milliseconds. Redis 5 and later
-- replicate a script's effects, not the script, so a script that reads
-- TIME may write.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- int formats an integer without an exponent (Redis would format a Lua
-- number given to redis.call as a float).
local function int(n)
  return string.format('%d', n)
end

-- read returns every field of the record at key, in the order the Go code
-- decodes them.
local function read(key)
  return redis.call('HMGET', key, 'status', 'fp', 'owner', 'fence', 'lease_until', 'retention',
    'created_at', 'completed_at', 'expires_at', 'code', 'header', 'body', 'omitted')
end

-- expire_at lets Redis delete the record grace ms after expires_at. Only a
-- completed record gets a TTL: a key with one is evictable under the
-- volatile-* maxmemory policies, and a live lease must not be.
local function expire_at(key, expires_at, grace)
  redis.call('PEXPIREAT', key, int(expires_at + grace))
end

-- held checks that the record at key is processing and held by owner and
-- fence: it returns the fields asked for (status, owner, fence, then the
-- others), or the same fields (nil if there is no record) and the reason
-- (1: no record, 2: not processing, 3: another owner or fence).
local function held(key, owner, fence, ...)
  local r = redis.call('HMGET', key, 'status', 'owner', 'fence', ...)
  if not r[1] then
    return nil, 1
  end
  if r[1] ~= 'processing' then
    return r, 2
  end
  if r[2] ~= owner or r[3] ~= fence then
    return r, 3
  end
  return r
end

