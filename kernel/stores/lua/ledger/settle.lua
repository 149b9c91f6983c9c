-- An outcome decided without running anything (Ledger.settle: the planner's rejections).
-- KEYS: entry, audit chain. ARGV: outcome json, now, retention_s. Returns 0 when the call is
-- missing or already finished, else 1.
--@include lib/retain.lua
-- luacheck: read globals retain
local h = redis.call('HMGET', KEYS[1], 'state', 'keep')
local state = h[1]
if state == false or state == 'finished' or state == 'committed' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'committed', 'outcome', ARGV[1], 'settled_at', ARGV[2])
if h[2] then
  redis.call('RPUSH', KEYS[2], cjson.encode({event='settled_without_running',
    at=tonumber(ARGV[2])}))
end
retain(KEYS[1], KEYS[2], tonumber(ARGV[3]))
return 1
