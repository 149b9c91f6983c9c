-- Mark published outcomes' entries committed (Ledger.commit, for the worker's step after
-- publishing): an entry that is finished becomes committed, and a plain run expires after
-- retention_s (0: never). KEYS: entries and their audit chains, pairwise, all of one slot
-- group. ARGV: retention_s. Returns 1.
--@include lib/retain.lua
-- luacheck: read globals retain
local function commit(call, audit, retention_s)
  if redis.call('HGET', call, 'state') == 'finished' then
    redis.call('HSET', call, 'state', 'committed')
    retain(call, audit, retention_s)
    return 1
  end
  return 0
end
local retention_s = tonumber(ARGV[1])
for i = 1, #KEYS, 2 do commit(KEYS[i], KEYS[i + 1], retention_s) end
return 1
