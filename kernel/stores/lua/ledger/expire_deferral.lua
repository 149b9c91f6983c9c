-- A deferred call's completion did not come by its deadline (Ledger.expire_deferral): it is
-- a started call whose holder is gone from now on (its effect is unknown, and probed), and a
-- completion that comes later finds it no longer deferred. KEYS: entry, audit chain. ARGV:
-- now. Returns 1 when it expired it, 0 when the call is not deferred or not due yet.
local h = redis.call('HMGET', KEYS[1], 'state', 'deferred_until', 'fencing_token')
if h[1] ~= 'deferred' or tonumber(h[2] or '0') > tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'state', 'started', 'lease_until', 0)
redis.call('RPUSH', KEYS[2], cjson.encode({event='deferral_expired',
  fencing_token=tonumber(h[3]), at=tonumber(ARGV[1])}))
return 1
