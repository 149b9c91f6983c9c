-- Record a planned call unless it exists (an existing entry is left as it is); with
-- ARGV[10] = '1' also issue its attempt, as dispatch.lua does (Ledger.create). KEYS: entry,
-- audit chain. ARGV: fingerprint, idem key, run, turn, tool, pool, now, arguments, index,
-- dispatch, policy, trace id. Returns {attempt, token}, {0, 0} when not dispatching, or a
-- negative attempt when no command should be sent.
--@include lib/issue.lua
-- luacheck: read globals issue plan
local h = redis.call('HMGET', KEYS[1], 'state', 'attempts', 'fencing_token', 'keep')
if not h[1] then
  h = plan(KEYS[1], ARGV[7], {ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6],
    ARGV[8], ARGV[9], ARGV[11], ARGV[12]})
end
if ARGV[10] ~= '1' then return {0, 0} end
return issue(KEYS[1], KEYS[2], h, false, tonumber(ARGV[7]), 'planned')
