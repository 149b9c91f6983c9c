-- Write a turn's changed fields (TurnHashes.write), a compare-and-set on its version field.
-- KEYS: the turn's hash. ARGV: the version read ('' when absent), ttl, the number of fields
-- to delete, their names, then field/value pairs to set. Returns the new version, 0 when the
-- turn changed meanwhile.
local v = redis.pcall('HGET', KEYS[1], 'v')
if type(v) == 'table' then
  -- A turn stored as one JSON string (as versions before 0.2 wrote it): the version read
  -- is its SHA-1, and the hash replaces it whole.
  if redis.sha1hex(redis.call('GET', KEYS[1])) ~= ARGV[1] then return 0 end
  redis.call('DEL', KEYS[1])
  v = 0
elseif (v or '') ~= ARGV[1] then
  return 0
end
-- In chunks: Lua's unpack takes at most ~8,000 values (a turn of thousands of calls).
local deletes = tonumber(ARGV[3])
for i = 4, 3 + deletes, 1000 do
  redis.call('HDEL', KEYS[1], unpack(ARGV, i, math.min(i + 999, 3 + deletes)))
end
local version, first = (tonumber(v) or 0) + 1, 4 + deletes
redis.call('HSET', KEYS[1], 'v', version, unpack(ARGV, first, math.min(first + 999, #ARGV)))
for i = first + 1000, #ARGV, 1000 do
  redis.call('HSET', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
if tonumber(ARGV[2]) > 0 then
  redis.call('EXPIRE', KEYS[1], ARGV[2])
else
  redis.call('PERSIST', KEYS[1])
end
return version
