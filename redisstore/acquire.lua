-- acquire.lua claims the lease on a record.
-- KEYS[1]: the record. ARGV: fingerprint, lease ms, retention ms, new owner.
-- Returns {1 (acquired), took over 0/1, fence, lease_until, created_at,
-- retention, expires_at} (the record it wrote, with the request's
-- fingerprint and the new owner), or {2 (in flight) | 3 (completed) |
-- 4 (mismatch), record fields}.
local key = KEYS[1]
local fp, lease, retention, owner = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local now = now_ms()

-- One read of every field: a replay, a duplicate or a mismatch returns
-- it as it is (see read in lib.lua for the order).
--
-- A processing record has no TTL, so that no maxmemory policy but
-- allkeys-* can evict a live lease: the record gets its TTL from Complete.
-- An abandoned one is replaced here, or removed by Sweep, once it is past
-- its expires_at, read from the record.
local r = read(key)
local fence, took = 1, 0
if r[1] then
  local status, fence_was = r[1], tonumber(r[4])
  if status == 'processing' and r[3] == owner then
    -- Ours already: the owner is this call's random token, so this is
    -- the call again (a client such as go-redis sends a script again when
    -- its reply was lost). Answer what the first run wrote, whether it
    -- took the key over included.
    local took_was = tonumber(redis.call('HGET', key, 'took')) or 0
    return {1, took_was, fence_was, tonumber(r[5]), tonumber(r[7]), tonumber(r[6]), tonumber(r[9])}
  end
  if now >= tonumber(r[9]) then
    -- Past its ExpiresAt (completed, or processing and abandoned): a new
    -- record replaces it whatever its fingerprint; the fence keeps counting.
    fence = fence_was + 1
    if status == 'processing' then
      took = 1
    end
    redis.call('DEL', key)
  elseif r[2] ~= fp then
    return {4, r}
  elseif status == 'completed' then
    return {3, r}
  elseif now < tonumber(r[5]) then
    return {2, r}
  else
    -- A processing record whose lease ended: take it over. It keeps its
    -- fingerprint and created_at.
    fence = fence_was + 1
    local lease_until = now + lease
    local expires = lease_until + retention
    redis.call('HSET', key, 'owner', owner, 'fence', int(fence), 'lease_until', int(lease_until),
      'retention', int(retention), 'expires_at', int(expires), 'took', 1)
    -- Records written by earlier versions of the store carry a TTL.
    redis.call('PERSIST', key)
    return {1, 1, fence, lease_until, tonumber(r[7]), retention, expires}
  end
end

local lease_until = now + lease
local expires = lease_until + retention
redis.call('HSET', key, 'status', 'processing', 'fp', fp, 'owner', owner, 'fence', int(fence),
  'lease_until', int(lease_until), 'retention', int(retention), 'created_at', int(now),
  'expires_at', int(expires), 'took', took)
return {1, took, fence, lease_until, now, retention, expires}
