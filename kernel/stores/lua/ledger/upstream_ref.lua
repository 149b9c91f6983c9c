-- The running attempt recorded the upstream's id for what it did (Ledger.record_upstream_ref).
-- KEYS: entry, audit chain. ARGV: token, ref. Returns 0 when the attempt is no longer the
-- current one (fenced off), else 1.
local h = redis.call('HMGET', KEYS[1], 'state', 'fencing_token', 'keep')
if h[1] ~= 'started' or tonumber(h[2]) ~= tonumber(ARGV[1]) then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('HSET', KEYS[1], 'upstream_ref', ARGV[2], 'upstream_ref_at', now)
if h[3] then
  redis.call('RPUSH', KEYS[2], cjson.encode({event='upstream_ref', ref=ARGV[2],
    fencing_token=tonumber(ARGV[1]), at=now}))
end
return 1
