-- An entry's member in one of its tenant's indexes (sorted sets of one score, ordered by
-- member: '<13-digit ms>\31<kind>\31<id>'), and the bounded trim that keeps each index
-- within the retention as it is written: at most `budget` members older than `cutoff` go
-- per write, so a write never costs more than that, and an index written once a second
-- sheds what ages out of it as fast as it gains. An index that nobody writes any more
-- expires whole, `ttl` after its last write.
-- luacheck: ignore 211/index 211/chunked
local function chunked(command, key, values, first)
  -- Lua's unpack takes at most ~8,000 values (a turn of thousands of calls).
  for i = first or 1, #values, 1000 do
    redis.call(command, key, unpack(values, i, math.min(i + 999, #values)))
  end
end
local function index(key, member, ttl, cutoff, budget)
  redis.call('ZADD', key, 0, member)
  if budget > 0 and cutoff ~= '' then
    local old = redis.call('ZRANGE', key, '-', '(' .. cutoff, 'BYLEX', 'LIMIT', 0, budget)
    if #old > 0 then redis.call('ZREM', key, unpack(old)) end
  end
  if ttl > 0 then
    redis.call('PEXPIRE', key, ttl)
  else
    redis.call('PERSIST', key)
  end
end
