-- The running attempt handed its work to an external system (Ledger.defer): the call waits,
-- holding no worker, until a completion ends it. Its member in the lease index is due at
-- deferred_until, so the reconciler finds a completion that never came (Ledger.expire_deferral).
-- KEYS: entry, audit chain, lease index. ARGV: token, worker, lease member, deferred_until
-- (Unix time), now. Returns 0 when the attempt is no longer this worker's (fenced off,
-- finished), else 1.
--@include lib/audit.lua
-- luacheck: read globals keep
local h = redis.call('HMGET', KEYS[1], 'state', 'fencing_token', 'worker_id')
if h[1] ~= 'started' or tonumber(h[2]) ~= tonumber(ARGV[1]) or h[3] ~= ARGV[2] then return 0 end
keep(KEYS[1], KEYS[2])
redis.call('HSET', KEYS[1], 'state', 'deferred', 'deferred_until', ARGV[4],
  'lease_until', ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3])
redis.call('RPUSH', KEYS[2], cjson.encode({event='deferred', worker=ARGV[2],
  fencing_token=tonumber(ARGV[1]), deferred_until=tonumber(ARGV[4]), at=tonumber(ARGV[5])}))
return 1
