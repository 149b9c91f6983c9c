-- The reconciler's (or a human's) verdict on a call (Ledger.resolve): replaces the stored
-- outcome, whatever the state, and appends why. KEYS: entry, audit chain, lease index.
-- ARGV: outcome json, event json, lease member. Returns 0 when the call is missing, else 1.
--@include lib/audit.lua
-- luacheck: read globals keep
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
keep(KEYS[1], KEYS[2])  -- before the outcome it replaces is gone
redis.call('HSET', KEYS[1], 'state', 'committed', 'outcome', ARGV[1], 'lease_until', 0)
redis.call('ZREM', KEYS[3], ARGV[3])
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1
