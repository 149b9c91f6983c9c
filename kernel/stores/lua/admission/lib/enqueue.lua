-- Queue calls (a call attempt already queued or admitted is skipped). KEYS[1..6]: active,
-- clock, waiting, info, payloads, deadlines; ARGV[first..last]: per entry member, tenant,
-- tool, pool, deadline ('' for none), payload. Returns how many were queued. With
-- ``deferred`` (a table), the queue entries are not written: each tenant's fresh entries go
-- into ``deferred[tenant]`` (oldest first) as {entry, member, {tenant, tool, pool, entry},
-- deadline, payload}, for the admission pass that follows to admit or write.
--@include chunks.lua
-- luacheck: read globals each fetch
-- luacheck: ignore 211/enqueue
local function enqueue(seq_key, first, last, deferred)
  local members, seen = {}, {}
  for i = first, last, 6 do
    if not seen[ARGV[i]] then
      seen[ARGV[i]] = true
      members[#members + 1] = i
    end
  end
  local names = {}
  for _, i in ipairs(members) do names[#names + 1] = ARGV[i] end
  local known = fetch('HMGET', KEYS[4], names)
  local fresh = {}
  for n, i in ipairs(members) do
    if not known[n] then fresh[#fresh + 1] = i end
  end
  if #fresh == 0 then return 0 end
  local seq = redis.call('INCRBY', seq_key, #fresh) - #fresh
  local queued, infos, bodies, due, tenants = {}, {}, {}, {}, {}
  for _, i in ipairs(fresh) do
    local member, tenant = ARGV[i], ARGV[i + 1]
    seq = seq + 1
    local entry = tenant .. '\31' .. string.format('%016d', seq) .. '\31' .. member
    infos[#infos + 1] = member
    infos[#infos + 1] = table.concat({tenant, ARGV[i + 2], ARGV[i + 3], entry}, '\31')
    bodies[#bodies + 1] = member
    bodies[#bodies + 1] = ARGV[i + 5]
    if deferred then
      local mine = deferred[tenant]
      if not mine then
        mine = {}
        deferred[tenant] = mine
      end
      mine[#mine + 1] = {entry, member, {tenant, ARGV[i + 2], ARGV[i + 3], entry}, ARGV[i + 4],
        ARGV[i + 5]}
    else
      queued[#queued + 1] = 0
      queued[#queued + 1] = entry
      if ARGV[i + 4] ~= '' then
        due[#due + 1] = ARGV[i + 4]
        due[#due + 1] = member
      end
    end
    tenants[tenant] = true
  end
  each('ZADD', KEYS[3], queued)
  each('HSET', KEYS[4], infos)
  each('HSET', KEYS[5], bodies)
  each('ZADD', KEYS[6], due)
  local fleet_clock = nil
  for tenant in pairs(tenants) do
    if not redis.call('ZSCORE', KEYS[1], tenant) then
      -- An arriving tenant starts at the fleet's virtual clock (or where it left off, if
      -- that is later): no credit saved from idle time, no debt either.
      fleet_clock = fleet_clock or tonumber(redis.call('HGET', KEYS[2], '\31clock') or '0')
      local vt = math.max(tonumber(redis.call('HGET', KEYS[2], tenant) or '0'), fleet_clock)
      redis.call('ZADD', KEYS[1], vt, tenant)
    end
  end
  return #fresh
end
