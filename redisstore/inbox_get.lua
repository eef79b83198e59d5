-- inbox_get.lua reads the consume record at KEYS[1] (see inbox_claim.lua).
return redis.call('HMGET', KEYS[1], 's', 'a', 'f', 'l', 'e', 'c', 'u')
