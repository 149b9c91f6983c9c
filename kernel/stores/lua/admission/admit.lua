-- One admission pass (Admission.admit): free the slots of released calls, confirm published
-- ones, queue new ones, then admit what can run, fairest tenant first.
-- KEYS: active, clock, waiting, info, payloads, deadlines, running, admitted, pending,
-- tenants, tools, buckets, workers, slots, seq. ARGV: now, max_n, lease_s, publish_lease_s,
-- default tenant json, safety, recovery_s, scan, n_release, members..., n_published,
-- members..., n_enqueue, entries (six each, as lib/enqueue.lua reads them)...
-- Returns a flat list: the seconds until a rate bucket that held a call back refills ('' if
-- none did), then member, payload, paced of each call to publish now (admitted, or pending
-- past its publish lease); paced: the rate scopes it took a token from, joined by '\30' (its
-- start passes them too: pace.lua).
--
-- ``scan`` 1 (a planner's pass) also sweeps what nobody released: expired leases, workers that
-- stopped registering, admitted calls no planner confirmed. A pass with 0 (a worker freeing
-- its own calls) leaves those sweeps to the scanning passes, and when nothing waits it stops
-- once the slots are free: a release then costs no read of capacity, order or queue.
--
-- Lua's calls into Redis cost more than the work they do here: the pass reads what it needs
-- in a few multi-key calls, decides in Lua, and writes each structure once at the end.
--@include lib/bucket.lua
-- luacheck: read globals bucket store_bucket
--@include lib/chunks.lua
-- luacheck: read globals each fetch split
--@include lib/enqueue.lua
-- luacheck: read globals enqueue

-- How far into a tenant's queue admission looks for a call that can run now (a call whose
-- tool is at its limit does not hold back the tenant's calls of other tools).
local LOOKAHEAD = 8

local now, max_n = tonumber(ARGV[1]), tonumber(ARGV[2])
local lease_s, publish_lease_s = tonumber(ARGV[3]), tonumber(ARGV[4])
-- Leases end on whole seconds (rounded up): a sorted set small enough to be a listpack
-- keeps an integral score as an integer, where each insert would otherwise parse every
-- score it passes as a float (python -m bench.admission_pass, 100 calls per pass: 34 -> 24
-- us of script time per call).
local lease_until = math.ceil(now + lease_s)
local publish_until = math.ceil(now + publish_lease_s)
local default_tenant = cjson.decode(ARGV[5])
local safety, recovery_s = tonumber(ARGV[6]), tonumber(ARGV[7])
local scan = ARGV[8] == '1'
local active, clock, waiting, info, payloads, deadlines = KEYS[1], KEYS[2], KEYS[3],
  KEYS[4], KEYS[5], KEYS[6]
local running, admitted, pending, tenants, tools, buckets, workers, slots = KEYS[7],
  KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14]

-- Counters of running calls: read once, changed here, written back once (write_counts).
local counts, deltas = {}, {}
local function running_of(field)
  local n = counts[field]
  if n == nil then
    n = tonumber(redis.call('HGET', running, field) or '0')
    counts[field] = n
  end
  return n
end
local function bump(field, by)
  counts[field] = running_of(field) + by
  deltas[field] = (deltas[field] or 0) + by
end
local function write_counts()
  for field, by in pairs(deltas) do
    if by ~= 0 and redis.call('HINCRBY', running, field, by) <= 0 then
      redis.call('HDEL', running, field)
    end
  end
end

-- Free the slots of calls whose outcome came (each once: a repeated release is a no-op).
local function release(list)
  local members, seen = {}, {}
  for _, m in ipairs(list) do
    if not seen[m] then
      seen[m] = true
      members[#members + 1] = m
    end
  end
  if #members == 0 then return end
  local scores = fetch('ZMSCORE', admitted, members)
  local held = {}
  for i, m in ipairs(members) do
    if scores[i] then held[#held + 1] = m end
  end
  if #held == 0 then return end
  for _, raw in ipairs(fetch('HMGET', info, held)) do
    if raw then
      local tenant, tool, pool = string.match(raw, '^([^\31]*)\31([^\31]*)\31([^\31]*)')
      bump('t:' .. tenant, -1)
      bump('o:' .. tool, -1)
      bump('p:' .. pool, -1)
    end
  end
  each('ZREM', admitted, held)
  each('HDEL', info, held)
  each('HDEL', payloads, held)
  each('ZREM', pending, held)
end

local at = 9
local released = {}
for i = at + 1, at + tonumber(ARGV[at]) do released[#released + 1] = ARGV[i] end
at = at + tonumber(ARGV[at]) + 1
local confirmed = {}
for i = at + 1, at + tonumber(ARGV[at]) do confirmed[#confirmed + 1] = ARGV[i] end
each('ZREM', pending, confirmed)
at = at + tonumber(ARGV[at]) + 1
-- Calls queued by this pass are kept here, not written to the queue: those admitted now
-- never touch it (the usual case with free capacity), the rest are written at the end.
local incoming = {}
local last = at + 6 * tonumber(ARGV[at])
enqueue(KEYS[15], at + 1, last, incoming)
-- Attempt N of a call exists only once the attempts before it are over (a retry, judged
-- lost): their slots are freed now if nobody released them (a retry's earlier admission
-- would otherwise hold its slot until its lease).
for i = at + 1, last, 6 do
  local call, n = string.match(ARGV[i], '^(.*\31)(%d+)$')
  for k = 1, (tonumber(n) or 1) - 1 do released[#released + 1] = call .. k end
end
if scan then
  -- The safety net: an admitted call whose outcome never came frees its slot at its lease.
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', admitted, '-inf', now, 'LIMIT', 0, 100)) do
    released[#released + 1] = m
  end
end
release(released)
-- A release with nothing waiting has nothing to admit: the usual worker pass ends here.
if not scan and next(incoming) == nil and redis.call('ZCARD', waiting) == 0 then
  write_counts()
  return {''}
end

-- Each pool's capacity: the slots of its live workers.
local capacity = {}
if scan then
  local gone = redis.call('ZRANGEBYSCORE', workers, '-inf', now)
  each('ZREM', workers, gone)
  each('HDEL', slots, gone)
end
local live = redis.call('ZRANGEBYSCORE', workers, now, '+inf')
if #live > 0 then
  for i, n in ipairs(redis.call('HMGET', slots, unpack(live))) do
    local pool = split(live[i])[1]
    capacity[pool] = (capacity[pool] or 0) + tonumber(n or '0')
  end
end
local function any_free()
  for pool, n in pairs(capacity) do
    if running_of('p:' .. pool) < n then return true end
  end
  return false
end

local function number(v) if v == nil or v == cjson.null then return nil end return tonumber(v) end
local configs = {tenants = {}, tools = {}}
local function config(hash, kind, name, default)
  local merged = configs[kind][name]
  if merged then return merged end
  merged = {}
  for k, v in pairs(default) do merged[k] = v end
  local raw = redis.call('HGET', hash, name)
  if raw then
    for k, v in pairs(cjson.decode(raw)) do merged[k] = v end
  end
  configs[kind][name] = merged
  return merged
end

local NO_TAKES = {}  -- no rate applies: shared, never written to
-- Whether the call (tenant, tool, pool) may run now; the buckets it takes a token from.
-- ``soonest``: seconds until the first bucket that held a call back has a token again.
local soonest = nil
local function eligible(tenant, tcfg, tool, pool)
  if running_of('p:' .. pool) >= (capacity[pool] or 0) then return nil end
  local limit = number(tcfg.max_concurrency)
  if limit and running_of('t:' .. tenant) >= limit then return nil end
  local ocfg = config(tools, 'tools', tool, {})
  limit = number(ocfg.max_concurrency)
  if limit and running_of('o:' .. tool) >= limit then return nil end
  local tenant_rate, tool_rate = number(tcfg.rate), number(ocfg.rate)
  local tool_tenant_rate = number(ocfg.tenant_rate)
  if not (tenant_rate or tool_rate or tool_tenant_rate) then return NO_TAKES end
  local takes = {}
  local rates = {
    {'t:' .. tenant, tenant_rate, number(tcfg.burst)},
    {'o:' .. tool, tool_rate, number(ocfg.burst)},
    {'to:' .. tenant .. '\31' .. tool, tool_tenant_rate, number(ocfg.tenant_burst)},
  }
  for _, r in ipairs(rates) do
    if r[2] then
      local burst = r[3] or 1
      local tokens, factor = bucket(buckets, r[1], r[2] * safety, burst, now, recovery_s)
      if tokens < 1 then
        local wait = (1 - tokens) / (r[2] * safety * factor)
        if soonest == nil or wait < soonest then soonest = wait end
        return nil
      end
      takes[#takes + 1] = {r[1], tokens, factor}
    end
  end
  return takes
end

-- Each tenant's queue, read LOOKAHEAD entries at a time as the pass needs them.
local queues = {}
local function queue_of(tenant)
  local q = queues[tenant]
  if q == nil then
    q = {entries = {}, taken = {}, first = 1, read = 0, done = false}
    queues[tenant] = q
  end
  return q
end
local function read_more(tenant, q)
  local got = redis.call('ZRANGEBYLEX', waiting, '[' .. tenant .. '\31',
    '(' .. tenant .. '\32', 'LIMIT', q.read, LOOKAHEAD)
  q.read = q.read + #got
  if #got > 0 then
    local members = {}
    for _, entry in ipairs(got) do members[#members + 1] = string.sub(entry, #tenant + 19) end
    local raws = redis.call('HMGET', info, unpack(members))
    for i, entry in ipairs(got) do
      q.entries[#q.entries + 1] = {entry, members[i], split(raws[i])}
    end
  end
  if #got < LOOKAHEAD then
    -- The stored queue is read: the calls this pass queued come after it (later sequence).
    q.done = true
    for _, e in ipairs(incoming[tenant] or {}) do q.entries[#q.entries + 1] = e end
  end
end
local function untaken(q)
  local n = 0
  for i = q.first, #q.entries do
    if not q.taken[i] then n = n + 1 end
  end
  return n
end
-- The first call among the tenant's next LOOKAHEAD waiting ones that can run now.
local function pick(tenant, tcfg)
  local q = queue_of(tenant)
  while q.taken[q.first] do q.first = q.first + 1 end  -- the taken head of the queue
  local looked, i = 0, q.first
  while looked < LOOKAHEAD do
    if i > #q.entries then
      if q.done then return nil, q end
      read_more(tenant, q)
      if i > #q.entries then return nil, q end
    end
    if not q.taken[i] then
      looked = looked + 1
      local e = q.entries[i]
      local takes = eligible(tenant, tcfg, e[3][2], e[3][3])
      if takes then return i, q, takes end
    end
    i = i + 1
  end
  return nil, q
end

local vts, moved, emptied = {}, {}, {}
local fleet_clock, clock_moved = 0, false
local free = any_free()
if free then
  local order = redis.call('ZRANGE', active, 0, -1, 'WITHSCORES')
  for i = 1, #order, 2 do vts[order[i]] = tonumber(order[i + 1]) end
  fleet_clock = tonumber(redis.call('HGET', clock, '\31clock') or '0')
end
-- A tenant none of whose next calls can run stays so for the rest of the pass (slots only
-- fill and tokens only go within a pass): it is looked at once.
local blocked = {}
local chosen, drop_waiting, drop_due, leases, unconfirmed = {}, {}, {}, {}, {}
-- Nothing is looked at while every pool is full, the usual pass under a backlog.
while free and #chosen < max_n and any_free() do
  -- The tenant with the lowest virtual time (then name, as the sorted set orders them)
  -- whose next calls include one that can run now.
  local found = nil
  while not found do
    local best = nil
    for tenant, vt in pairs(vts) do
      if not blocked[tenant] and not emptied[tenant] and (best == nil or vt < vts[best]
          or (vt == vts[best] and tenant < best)) then
        best = tenant
      end
    end
    if best == nil then break end
    local tcfg = config(tenants, 'tenants', best, default_tenant)
    local i, q, takes = pick(best, tcfg)
    if i then
      found = {best, i, q, takes, number(tcfg.weight) or 1}
    elseif q.done and untaken(q) == 0 then
      emptied[best] = true
    else
      blocked[best] = true
    end
  end
  if not found then break end
  local tenant, i, q, takes, weight = unpack(found)
  local vt = vts[tenant]
  -- A tenant held back by its own limits saves no credit meanwhile: it moves up to the
  -- virtual time of the call admitted in its place.
  for held in pairs(blocked) do
    if vts[held] < vt then
      vts[held] = vt
      moved[held] = true
    end
  end
  local e = q.entries[i]
  local entry, member, f = e[1], e[2], e[3]
  q.taken[i] = true
  if e[5] then
    e.taken = true  -- queued by this pass: never written to the queue
  else
    drop_waiting[#drop_waiting + 1] = entry
    drop_due[#drop_due + 1] = member
  end
  bump('t:' .. tenant, 1)
  bump('o:' .. f[2], 1)
  bump('p:' .. f[3], 1)
  bump('admitted:' .. tenant, 1)
  local scopes = {}
  for _, t in ipairs(takes) do
    store_bucket(buckets, t[1], t[2] - 1, now, t[3])
    scopes[#scopes + 1] = t[1]
  end
  e.paced = table.concat(scopes, '\30')
  leases[#leases + 1] = lease_until
  leases[#leases + 1] = member
  unconfirmed[#unconfirmed + 1] = publish_until
  unconfirmed[#unconfirmed + 1] = member
  vts[tenant] = vt + 1 / math.max(weight, 0.001)
  moved[tenant] = true
  if vt > fleet_clock then
    fleet_clock = vt
    clock_moved = true
  end
  chosen[#chosen + 1] = e
end

-- Write back what the pass changed.
write_counts()
each('ZREM', waiting, drop_waiting)
each('ZREM', deadlines, drop_due)
-- What this pass queued and did not admit waits in the queue now.
local queued, due = {}, {}
for _, list in pairs(incoming) do
  for _, e in ipairs(list) do
    if not e.taken then
      queued[#queued + 1] = 0
      queued[#queued + 1] = e[1]
      if e[4] ~= '' then
        due[#due + 1] = e[4]
        due[#due + 1] = e[2]
      end
    end
  end
end
each('ZADD', waiting, queued)
each('ZADD', deadlines, due)
each('ZADD', admitted, leases)
each('ZADD', pending, unconfirmed)
local scores = {}
for tenant in pairs(moved) do
  if not emptied[tenant] then
    scores[#scores + 1] = vts[tenant]
    scores[#scores + 1] = tenant
  end
end
each('ZADD', active, scores)
-- A tenant with nothing waiting leaves the order; it comes back at the fleet's clock.
for tenant in pairs(emptied) do
  redis.call('ZREM', active, tenant)
  redis.call('HSET', clock, tenant, vts[tenant])
end
if clock_moved then redis.call('HSET', clock, '\31clock', fleet_clock) end

local out = {''}
local stored = {}
for _, e in ipairs(chosen) do
  if not e[5] then stored[#stored + 1] = e[2] end
end
local bodies = fetch('HMGET', payloads, stored)
local n = 0
for _, e in ipairs(chosen) do
  out[#out + 1] = e[2]
  if e[5] then
    out[#out + 1] = e[5]
  else
    n = n + 1
    out[#out + 1] = bodies[n]
  end
  out[#out + 1] = e.paced
end
-- Admitted but not confirmed on Kafka within the publish lease: its planner is gone.
local stale = scan and redis.call('ZRANGEBYSCORE', pending, '-inf', now, 'LIMIT', 0, 100) or {}
if #stale > 0 then
  local again = {}
  for _, member in ipairs(stale) do
    again[#again + 1] = publish_until
    again[#again + 1] = member
  end
  each('ZADD', pending, again)
  local stale_bodies = redis.call('HMGET', payloads, unpack(stale))
  for i, member in ipairs(stale) do
    out[#out + 1] = member
    out[#out + 1] = stale_bodies[i]
    out[#out + 1] = ''  -- handed out again: its start is not paced (rare; its planner died)
  end
end
if soonest then out[1] = tostring(soonest) end
return out
