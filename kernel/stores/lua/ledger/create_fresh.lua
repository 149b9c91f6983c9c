-- A turn whose calls are all new, in one script (Ledger.create_fresh). KEYS: the run's
-- approval state and its wrong-effect hold, then each call's entry and audit chain. ARGV:
-- now, then the 10 fields of each call. Records and dispatches every call (attempt 1, token
-- 1 each) only if none of those keys exists; returns the number of calls dispatched, 0 when
-- it wrote nothing.
--@include lib/issue.lua
-- luacheck: read globals issue plan
for i = 1, #KEYS, 1000 do  -- in chunks: Lua's unpack takes at most ~8,000 values
  if redis.call('EXISTS', unpack(KEYS, i, math.min(i + 999, #KEYS))) > 0 then return 0 end
end
local now = tonumber(ARGV[1])
for i = 3, #KEYS, 2 do
  local a = (i - 3) / 2 * 10 + 1
  local h = plan(KEYS[i], ARGV[1], {ARGV[a + 1], ARGV[a + 2], ARGV[a + 3],
    ARGV[a + 4], ARGV[a + 5], ARGV[a + 6], ARGV[a + 7], ARGV[a + 8], ARGV[a + 9], ARGV[a + 10]})
  issue(KEYS[i], KEYS[i + 1], h, false, now, 'planned')
end
return (#KEYS - 2) / 2
