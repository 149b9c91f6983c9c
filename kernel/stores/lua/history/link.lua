-- Add to an entry what was decided after it was written (History.link): the person who
-- decided the approval of one of a turn's calls, a human task's resolution. An entry not
-- written yet keeps the fields for its write (which reads them first, and writes only if
-- they are still what it read).
-- KEYS[1]: the entry's hash; KEYS[2 .. n_add + 1]: indexes to add the entry to; the rest:
-- indexes to take it out of.
-- ARGV: ttl_ms (0: kept for ever), cutoff (13-digit ms; '' trims nothing), trim budget,
-- n_add, call id and decider ('' and '': none), then (field, value) pairs to set.
-- Returns 'linked', or 'missing' when the entry has no member yet (its fields are kept).
--
-- Deciders are lines 'call id \31 decider' joined by '\30' in the entry's `by` field: one
-- per call, the latest decision's.
--@include lib/index.lua
-- luacheck: read globals index chunked
local entry = KEYS[1]
local ttl, cutoff, budget = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local n_add, call, decider = tonumber(ARGV[4]), ARGV[5], ARGV[6]

if decider ~= '' then
  local lines = {}
  local prefix = call .. '\31'
  for line in string.gmatch(redis.call('HGET', entry, 'by') or '', '[^\30]+') do
    if string.sub(line, 1, #prefix) ~= prefix then lines[#lines + 1] = line end
  end
  lines[#lines + 1] = prefix .. decider
  redis.call('HSET', entry, 'by', table.concat(lines, '\30'))
end
if #ARGV > 6 then
  redis.call('HSET', entry, unpack(ARGV, 7, #ARGV))
end

local member = redis.call('HGET', entry, 'm')
if not member then
  if ttl > 0 then redis.call('PEXPIRE', entry, ttl) end
  return 'missing'
end
for i = 2, n_add + 1 do
  index(KEYS[i], member, ttl, cutoff, budget)
end
for i = n_add + 2, #KEYS do
  redis.call('ZREM', KEYS[i], member)
end
return 'linked'
