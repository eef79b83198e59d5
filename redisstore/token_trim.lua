-- token_trim.lua trims the unused tokens of a scope (see
-- token_insert.lua). KEYS[1]: the set of the scope's unused tokens.
-- ARGV: keep, the prefix of the scope's token keys
-- (PREFIX:token:{SCOPETAG}:, the set's slot), the scope.
-- It drops the members whose expiry has passed (Redis deleted their keys
-- already), then deletes the tokens beyond the keep newest (by expiry,
-- then digest) with their keys. A member is unused: Consume takes a token
-- out of the set when it spends it. A key is deleted only if it holds an
-- unused token of the scope: another scope whose tag is the same has a
-- set of its own, and its tokens are never this scope's. Returns the
-- number of members removed.
local set, keep, base, scope = KEYS[1], tonumber(ARGV[1]), ARGV[2], ARGV[3]
local removed = redis.call('ZREMRANGEBYSCORE', set, '-inf', int(now_ms()))
local n = redis.call('ZCARD', set)
if n > keep then
  local old = redis.call('ZRANGE', set, 0, n - keep - 1)
  for _, d in ipairs(old) do
    local key = base .. d
    local t = redis.call('HMGET', key, 's', 'u')
    if t[1] == scope and not t[2] then
      redis.call('DEL', key)
    end
  end
  removed = removed + redis.call('ZREMRANGEBYRANK', set, 0, n - keep - 1)
end
return removed
