-- token_consume.lua spends a token of package token (see token_insert.lua).
-- KEYS[1]: the token; KEYS[2]: the set of the scope's unused tokens.
-- ARGV: scope, result (may be empty: none), fingerprint (may be empty:
-- none), keep (ms), digest, use (a random token of this call, kept with
-- the use: a client that sends the script again after its reply was lost,
-- as go-redis does, finds its own use and is told it spent the token).
-- Returns {0}: no live token of the scope (unknown, expired, trimmed,
-- another scope's: left as it is); {1}: spent now; {2, used_at, result,
-- fingerprint}: spent before ('' for none). The use moves the key's
-- expiry to now + keep if that is later, and takes the token out of the
-- set: a used token is neither counted nor trimmed.
local key = KEYS[1]
local t = redis.call('HMGET', key, 's', 'u', 'r', 'f', 'n')
if not t[1] or t[1] ~= ARGV[1] then
  return {0}
end
if t[2] then
  if t[5] == ARGV[6] then
    return {1}
  end
  return {2, t[2], t[3] or '', t[4] or ''}
end
local now = now_ms()
local fields = {'u', int(now), 'n', ARGV[6]}
if ARGV[2] ~= '' then
  table.insert(fields, 'r')
  table.insert(fields, ARGV[2])
end
if ARGV[3] ~= '' then
  table.insert(fields, 'f')
  table.insert(fields, ARGV[3])
end
redis.call('HSET', key, unpack(fields))
local pttl = redis.call('PTTL', key)
local keep = tonumber(ARGV[4])
if pttl >= 0 and pttl < keep then
  redis.call('PEXPIREAT', key, int(now + keep))
end
redis.call('ZREM', KEYS[2], ARGV[5])
return {1}
