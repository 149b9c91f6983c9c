-- The audit chain, and a plain run's events from the entry (none once the call is kept)
-- (Ledger.audit). KEYS: entry, audit chain. Returns {chain, plain events}.
--@include lib/audit.lua
-- luacheck: read globals plain_events
local chain = redis.call('LRANGE', KEYS[2], 0, -1)
if redis.call('HGET', KEYS[1], 'keep') then return {chain, {}} end
return {chain, plain_events(KEYS[1])}
