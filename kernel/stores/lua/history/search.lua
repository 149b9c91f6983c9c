-- One step of a history query on one tenant (History.search): walk the most selective of
-- the query's indexes newest first, between two bounds, and keep the members that every
-- other index of the query holds too.
-- KEYS: the query's indexes (one tenant's, so one hash slot).
-- ARGV: from (the upper ZRANGE BYLEX bound: '+', '(member' or '[member'), to (the lower:
-- '-' or '[<13-digit ms>'), want (members to find at most), budget (members to look at at
-- most).
-- Returns {last member looked at ('' none), members looked at, 1 when the walk reached `to`
-- (nothing is left), the members found...}.
--
-- The walked index is the one with the fewest members between the bounds (ZLEXCOUNT, one
-- O(log n) count each): a run's few turns are walked, not the tenant's every turn; every
-- other index is asked about each member walked (ZSCORE, O(1)). The budget bounds the work
-- of one step whatever the data: a query that matches rarely returns what it found and
-- where it stopped, and the caller goes on from there.
local from, to = ARGV[1], ARGV[2]
local want, budget = tonumber(ARGV[3]), tonumber(ARGV[4])
local CHUNK = 256

local walk, fewest = 1, nil
for i = 1, #KEYS do
  local count = redis.call('ZLEXCOUNT', KEYS[i], to, from)
  if count == 0 then return {'', 0, 1} end
  if not fewest or count < fewest then walk, fewest = i, count end
end

local found, looked, last, done = {}, 0, '', false
while #found < want and looked < budget do
  local asked = math.min(CHUNK, budget - looked)
  local batch = redis.call('ZRANGE', KEYS[walk], from, to, 'BYLEX', 'REV', 'LIMIT', 0, asked)
  local used = 0
  for _, member in ipairs(batch) do
    used = used + 1
    looked = looked + 1
    last = member
    local everywhere = true
    for i = 1, #KEYS do
      if i ~= walk and not redis.call('ZSCORE', KEYS[i], member) then
        everywhere = false
        break
      end
    end
    if everywhere then
      found[#found + 1] = member
      if #found >= want then break end
    end
  end
  if #batch < asked and used == #batch then
    done = true
    break
  end
  from = '(' .. last
end
return {last, looked, done and 1 or 0, unpack(found)}
