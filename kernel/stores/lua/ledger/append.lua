-- Append one event to a call's audit chain and keep the call (Ledger.append_audit,
-- set_approval). KEYS: entry, audit chain. ARGV: the event (JSON), then field/value pairs to
-- set on its entry first (an approval decision).
--@include lib/audit.lua
-- luacheck: read globals keep
if #ARGV > 1 then redis.call('HSET', KEYS[1], unpack(ARGV, 2)) end
if redis.call('EXISTS', KEYS[1]) == 1 then keep(KEYS[1], KEYS[2]) end
redis.call('RPUSH', KEYS[2], ARGV[1])
