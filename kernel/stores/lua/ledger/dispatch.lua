-- Issue an attempt of an existing call (Ledger.dispatch; lib/issue.lua says how). KEYS:
-- entry, audit chain. ARGV: now, reason, and for a forced issue the fencing token of the
-- attempt it follows ('' unforced). Returns {attempt, token}; a negative attempt when no
-- command should be sent ({-1, 0}: no such call).
--@include lib/issue.lua
-- luacheck: read globals issue
local h = redis.call('HMGET', KEYS[1], 'state', 'attempts', 'fencing_token', 'keep')
if not h[1] then return {-1, 0} end
return issue(KEYS[1], KEYS[2], h, ARGV[3] ~= '', tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]))
