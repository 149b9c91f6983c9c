-- An attempt that waited past its tool's schedule-to-start timeout never starts
-- (Ledger.never_started): its outcome is stored as finished, only while nothing has started
-- the call, and the call is kept with the event in its audit chain. KEYS: entry, audit
-- chain. ARGV: token, outcome json, now, the timeout (seconds). Returns ok (stored), stale (a
-- newer attempt exists), missing, or the state that forbids it (started, finished,
-- committed): the caller then goes on as Ledger.begin's verdict on the call says.
--@include lib/audit.lua
-- luacheck: read globals keep
local h = redis.call('HMGET', KEYS[1], 'state', 'fencing_token')
local state = h[1]
if state == false then return 'missing' end
if tonumber(ARGV[1]) ~= tonumber(h[2]) then return 'stale' end
if state ~= 'planned' and state ~= 'dispatched' then return state end
keep(KEYS[1], KEYS[2])
redis.call('HSET', KEYS[1], 'state', 'finished', 'outcome', ARGV[2], 'finished_at', ARGV[3])
redis.call('RPUSH', KEYS[2], cjson.encode({event='not_started_in_time',
  schedule_to_start_s=tonumber(ARGV[4]), fencing_token=tonumber(ARGV[1]),
  at=tonumber(ARGV[3])}))
return 'ok'
