-- token_consume.lua spends a token of package token (see token_insert.lua).
-- KEYS[1]: the token. ARGV: scope, result (may be empty: none).
-- Returns {0}: no live token of the scope (unknown, expired, another
-- scope's: left as it is); {1}: spent now; {2, used_at, result}: spent
-- before (result '' for none). HSET keeps the key's expiry: a used token
-- lives as long as it would have unused.
local key = KEYS[1]
local t = redis.call('HMGET', key, 's', 'u', 'r')
if not t[1] or t[1] ~= ARGV[1] then
  return {0}
end
if t[2] then
  return {2, t[2], t[3] or ''}
end
if ARGV[2] == '' then
  redis.call('HSET', key, 'u', int(now_ms()))
else
  redis.call('HSET', key, 'u', int(now_ms()), 'r', ARGV[2])
end
return {1}
