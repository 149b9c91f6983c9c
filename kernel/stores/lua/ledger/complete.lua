-- A deferred call's completion arrived (Ledger.complete): its outcome is stored as finished,
-- once. KEYS: entry, audit chain. ARGV: token (the handle's), outcome json, now, completed by.
-- Returns ok, stale (the handle names an older attempt), done (already finished: a repeated
-- completion), missing, or the state that forbids it (a call that is not deferred).
local h = redis.call('HMGET', KEYS[1], 'state', 'fencing_token')
local state = h[1]
if state == false then return 'missing' end
if tonumber(ARGV[1]) ~= tonumber(h[2]) then return 'stale' end
if state == 'finished' or state == 'committed' then return 'done' end
if state ~= 'deferred' then return state end
redis.call('HSET', KEYS[1], 'state', 'finished', 'outcome', ARGV[2], 'finished_at', ARGV[3])
redis.call('RPUSH', KEYS[2], cjson.encode({event='completed', by=ARGV[4],
  fencing_token=tonumber(ARGV[1]), at=tonumber(ARGV[3])}))
return 'ok'
