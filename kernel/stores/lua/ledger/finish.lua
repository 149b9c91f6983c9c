-- Store the outcomes of current attempts, a batch at once (Ledger.finish, SlotGroupBatches).
-- KEYS, three per call: entry, audit chain, lease index. ARGV, seven per call: token, outcome
-- json, status, effect, now, lease member, failure json ('' when user code raised nothing).
-- Returns ok, stale, done or missing per call.
--
-- Every failed attempt's failure is kept in the entry: the latest in 'failure' (what readers
-- of earlier releases read), each earlier one under 'failure:<its attempt>', moved there when
-- a later attempt's failure takes its place. They expire with the entry.
local function keep_failure(entry, failure)
  local previous = redis.call('HGET', entry, 'failure')
  if previous then
    local ok, old = pcall(cjson.decode, previous)
    if ok and type(old) == 'table' and tonumber(old.attempt) then
      redis.call('HSET', entry, 'failure:' .. string.format('%d', old.attempt), previous)
    end
  end
  redis.call('HSET', entry, 'failure', failure)
end
local function finish(entry, audit, leases, a)
  local h = redis.call('HMGET', entry, 'state', 'fencing_token', 'keep')
  if h[1] == false then return 'missing' end
  if tonumber(ARGV[a]) ~= tonumber(h[2]) then return 'stale' end
  if h[1] == 'finished' or h[1] == 'committed' then return 'done' end
  redis.call('HSET', entry, 'state', 'finished', 'outcome', ARGV[a + 1], 'lease_until', 0,
    'finished_at', ARGV[a + 4])
  if ARGV[a + 6] ~= '' then keep_failure(entry, ARGV[a + 6]) end
  redis.call('ZREM', leases, ARGV[a + 5])
  if h[3] then
    redis.call('RPUSH', audit, cjson.encode({event='finished', status=ARGV[a + 2],
      effect=ARGV[a + 3], fencing_token=tonumber(ARGV[a]), at=tonumber(ARGV[a + 4])}))
  end
  return 'ok'
end
local out = {}
for i = 1, #KEYS, 3 do
  out[#out + 1] = finish(KEYS[i], KEYS[i + 1], KEYS[i + 2], (i - 1) / 3 * 7 + 1)
end
return out
