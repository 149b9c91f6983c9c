-- Compare-and-set of one JSON value (GateStore.update): write the new value only if the key
-- still holds what was read (by its SHA-1; an absent key reads as ''). KEYS: the value's
-- key. ARGV: sha1 of the value read, new value, ttl (0: kept forever). Returns 1 when it
-- wrote, else 0.
local current = redis.call('GET', KEYS[1]) or ''
if redis.sha1hex(current) ~= ARGV[1] then return 0 end
if tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[2])
end
return 1
