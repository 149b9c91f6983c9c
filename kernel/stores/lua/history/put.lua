-- Write one history entry (History.put): a turn, an approval decision, a human task or a
-- cancellation, as a hash of its own, and its member in every index it belongs to now.
-- KEYS[1]: the entry's hash; KEYS[2]: the hash its guards and marks are on (its run's
-- marks, or the entry itself); KEYS[3 .. n_new + 2]: the indexes the entry belongs to; the
-- rest: the indexes the entry was in as the caller read it (its old member leaves them).
-- ARGV: seq, member, ttl_ms (0: kept for ever), cutoff (13-digit ms; '' trims nothing),
-- trim budget, n_new, the entry's seq, by and res as the caller read them ('' none),
-- n_guards, (field, value read) * n_guards, n_fields, (field, value) * n_fields, n_marks,
-- (field, value) * n_marks.
-- Returns 'written'; 'older' when the entry holds a later write (a greater seq: the newer
-- result of a resumed turn, say); 'stale' when the entry, or a guard field, no longer holds
-- what the caller read and built this write from (nothing written: read again, retry).
--
-- A rewrite (a redelivery, a turn resumed after its approvals) takes the entry's old member
-- out of the indexes it no longer belongs to, so an index holds each entry once.
--@include lib/index.lua
-- luacheck: read globals index chunked
local entry, marks_on = KEYS[1], KEYS[2]
local seq, member = ARGV[1], ARGV[2]
local ttl, cutoff, budget = tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local n_new = tonumber(ARGV[6])

local held = redis.call('HMGET', entry, 'seq', 'by', 'res', 'm')
if held[1] and held[1] > seq then
  return 'older'
end
if (held[1] or '') ~= ARGV[7] or (held[2] or '') ~= ARGV[8] or (held[3] or '') ~= ARGV[9] then
  return 'stale'
end

local at = 10
local n = tonumber(ARGV[at])
for i = at + 1, at + 2 * n, 2 do
  if (redis.call('HGET', marks_on, ARGV[i]) or '') ~= ARGV[i + 1] then
    return 'stale'
  end
end
at = at + 2 * n + 1
n = tonumber(ARGV[at])
local fields = {unpack(ARGV, at + 1, at + 2 * n)}
at = at + 2 * n + 1
n = tonumber(ARGV[at])
local marks = {}
for i = at + 1, at + 2 * n do marks[#marks + 1] = ARGV[i] end

local was = held[4]
if was then
  local now_in = {}
  for i = 3, n_new + 2 do now_in[KEYS[i]] = true end
  for i = n_new + 3, #KEYS do
    if was ~= member or not now_in[KEYS[i]] then redis.call('ZREM', KEYS[i], was) end
  end
end

redis.call('HSET', entry, 'm', member, 'seq', seq, unpack(fields))
if ttl > 0 then
  redis.call('PEXPIRE', entry, ttl)
else
  redis.call('PERSIST', entry)
end
for i = 3, n_new + 2 do
  index(KEYS[i], member, ttl, cutoff, budget)
end
if #marks > 0 then
  chunked('HSET', marks_on, marks)
  if ttl > 0 then redis.call('PEXPIRE', marks_on, ttl) end
end
return 'written'
