"""Admission: a call reaches Kafka only when it can run, and tenants share capacity by weight.

The planner hands every call it dispatches to ``Admission.enqueue``; ``Admission.admit``
returns the commands that may go to Kafka now. A call is admitted when all of these hold:

- its pool has a free slot: the pool's capacity is the sum of its live workers' slots (each
  worker registers them, ``register_worker``, and keeps registering while it runs);
- its tenant is under the tenant's ``max_concurrency`` and its tool under the tool's;
- a token is free in each rate limit that applies: the tenant's, the tool's and the tool's
  per-tenant rate (token buckets shared by the fleet, refilled at ``RATE_SAFETY`` of the
  declared rate so that calls, which start at the workers a few milliseconds apart from when
  they were admitted, stay under it in any window of a second). An HTTP 429 from the tool
  halves its buckets' rate, which recovers linearly over ``RECOVERY_S``.

Among tenants with waiting calls the next admission goes to the one with the lowest virtual
time, which grows by 1/weight per admitted call (start-time fair queueing): backlogged
tenants get capacity in proportion to their weights, and a tenant that arrives gets the
next free slot instead of waiting behind another tenant's backlog. A tenant that was idle
re-enters at the current virtual time, never with credit saved from before, and so does a
tenant held back by its own quota or rate while others were admitted.

Every decision is one Lua script over keys of one hash slot (``{adm}``), so several planners
admit concurrently without exceeding a quota or admitting a call twice. An admitted call
holds its slot until its outcome is released (``admit(release=...)``), or until its lease
(``lease_s``) runs out (a safety net: a lost outcome cannot leak a slot forever). An admitted
command is *pending* until the planner confirms it is on Kafka; a planner that dies in
between leaves it pending, and the next planner's tick publishes it again (commands are
idempotent: the ledger gates every attempt). A call that the pass queueing it admits at once
never enters the queue: only what must wait is written there (the usual case with free
capacity costs Redis no queue entry, no deadline entry, and no read-back of the payload).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from redis.asyncio import Redis

from kernel.adapters.redis import text
from kernel.settings import Settings
from kernel.stores.keys import Keys
from schemas import ExecutionCommand

RATE_SAFETY = 0.9
"""Buckets refill at this share of the declared rate (a margin for start-time jitter)."""

RECOVERY_S = 10.0
"""After an HTTP 429, a bucket's rate climbs back from its cut to the full rate over this."""

LOOKAHEAD = 8
"""How far into a tenant's queue admission looks for a call that can run now (a call whose
tool is at its limit does not hold back the tenant's calls of other tools)."""

SEP = "\x1f"

_BUCKET = """
local function bucket(buckets, scope, rate, burst, now, recovery_s)
  local tokens, ts, factor = burst, now, 1
  local raw = redis.call('HGET', buckets, scope)
  if raw then
    local a, b, c = string.match(raw, '([^,]+),([^,]+),([^,]+)')
    tokens, ts, factor = tonumber(a), tonumber(b), tonumber(c)
  end
  local elapsed = math.max(0, now - ts)
  factor = math.min(1, factor + elapsed / recovery_s)
  tokens = math.min(burst, tokens + elapsed * rate * factor)
  return tokens, factor
end
local function store_bucket(buckets, scope, tokens, now, factor)
  redis.call('HSET', buckets, scope, tokens .. ',' .. now .. ',' .. factor)
end
"""

_CHUNKS = """
-- Multi-key commands in chunks (Lua's unpack takes a few thousand values at most).
local CHUNK = 500
local function each(cmd, key, list)
  for i = 1, #list, CHUNK do
    redis.call(cmd, key, unpack(list, i, math.min(i + CHUNK - 1, #list)))
  end
end
local function fetch(cmd, key, list)
  local out = {}
  for i = 1, #list, CHUNK do
    local part = redis.call(cmd, key, unpack(list, i, math.min(i + CHUNK - 1, #list)))
    for _, v in ipairs(part) do out[#out + 1] = v end
  end
  return out
end
local function split(s)
  local out, start = {}, 1
  while true do
    local i = string.find(s, '\\31', start, true)
    if not i then
      out[#out + 1] = string.sub(s, start)
      return out
    end
    out[#out + 1] = string.sub(s, start, i - 1)
    start = i + 1
  end
end
"""

# Queue calls (a call attempt already queued or admitted is skipped). KEYS[1..6]: active,
# clock, waiting, info, payloads, deadlines; ARGV[first..last]: per entry member, tenant,
# tool, pool, deadline ('' for none), payload. Returns how many were queued. With ``deferred``
# (a table), the queue entries are not written: each tenant's fresh entries go into
# ``deferred[tenant]`` (oldest first) as {entry, member, {tenant, tool, pool, entry}, deadline,
# payload}, for the admission pass that follows to admit or write.
_ENQUEUE_FN = """
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
    local entry = tenant .. '\\31' .. string.format('%016d', seq) .. '\\31' .. member
    infos[#infos + 1] = member
    infos[#infos + 1] = table.concat({tenant, ARGV[i + 2], ARGV[i + 3], entry}, '\\31')
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
      fleet_clock = fleet_clock or tonumber(redis.call('HGET', KEYS[2], '\\31clock') or '0')
      local vt = math.max(tonumber(redis.call('HGET', KEYS[2], tenant) or '0'), fleet_clock)
      redis.call('ZADD', KEYS[1], vt, tenant)
    end
  end
  return #fresh
end
"""

# KEYS: active, clock, waiting, info, payloads, deadlines, seq. ARGV: now, then the entries.
_ENQUEUE = _CHUNKS + _ENQUEUE_FN + "return enqueue(KEYS[7], 2, #ARGV)\n"

# KEYS: active, clock, waiting, info, payloads, deadlines, running, admitted, pending,
# tenants, tools, buckets, workers, slots, seq. ARGV: now, max_n, lease_s, publish_lease_s,
# default tenant json, safety, recovery_s, n_release, members..., n_published, members...,
# n_enqueue, entries (as ``_ENQUEUE_FN`` reads them)...
# Returns a flat list: the seconds until a rate bucket that held a call back refills ('' if
# none did), then member, payload of each call to publish now (admitted, or pending past its
# publish lease).
#
# Lua's calls into Redis cost more than the work they do here: the pass reads what it needs
# in a few multi-key calls, decides in Lua, and writes each structure once at the end.
_ADMIT = (
    _BUCKET
    + _CHUNKS
    + _ENQUEUE_FN
    + """
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
local active, clock, waiting, info, payloads, deadlines = KEYS[1], KEYS[2], KEYS[3],
  KEYS[4], KEYS[5], KEYS[6]
local running, admitted, pending, tenants, tools, buckets, workers, slots = KEYS[7],
  KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14]

-- Counters of running calls: read once, changed here, written back once.
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
      local tenant, tool, pool = string.match(raw, '^([^\\31]*)\\31([^\\31]*)\\31([^\\31]*)')
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

local at = 8
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
enqueue(KEYS[15], at + 1, at + 6 * tonumber(ARGV[at]), incoming)
-- The safety net: an admitted call whose outcome never came frees its slot at its lease.
for _, m in ipairs(redis.call('ZRANGEBYSCORE', admitted, '-inf', now, 'LIMIT', 0, 100)) do
  released[#released + 1] = m
end
release(released)

-- Each pool's capacity: the slots of its live workers.
local capacity = {}
local gone = redis.call('ZRANGEBYSCORE', workers, '-inf', now)
each('ZREM', workers, gone)
each('HDEL', slots, gone)
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
    {'to:' .. tenant .. '\\31' .. tool, tool_tenant_rate, number(ocfg.tenant_burst)},
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
  local got = redis.call('ZRANGEBYLEX', waiting, '[' .. tenant .. '\\31',
    '(' .. tenant .. '\\32', 'LIMIT', q.read, LOOKAHEAD)
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
  fleet_clock = tonumber(redis.call('HGET', clock, '\\31clock') or '0')
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
  for _, t in ipairs(takes) do store_bucket(buckets, t[1], t[2] - 1, now, t[3]) end
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
for field, by in pairs(deltas) do
  if by ~= 0 and redis.call('HINCRBY', running, field, by) <= 0 then
    redis.call('HDEL', running, field)
  end
end
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
if clock_moved then redis.call('HSET', clock, '\\31clock', fleet_clock) end

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
end
-- Admitted but not confirmed on Kafka within the publish lease: its planner is gone.
local stale = redis.call('ZRANGEBYSCORE', pending, '-inf', now, 'LIMIT', 0, 100)
if #stale > 0 then
  local again = {}
  for _, member in ipairs(stale) do
    again[#again + 1] = publish_until
    again[#again + 1] = member
  end
  each('ZADD', pending, again)
  local stale_bodies = redis.call('HMGET', payloads, unpack(stale))
  for n, member in ipairs(stale) do
    out[#out + 1] = member
    out[#out + 1] = stale_bodies[n]
  end
end
if soonest then out[1] = tostring(soonest) end
return out
"""
).replace("LOOKAHEAD", str(LOOKAHEAD))

# KEYS: waiting, info, payloads, deadlines. ARGV: 'deadline', now | 'run', tenant, prefix.
# Removes waiting calls past their deadline, or every waiting call of one run; returns a
# flat list of member, payload.
_WITHDRAW = """
local out = {}
local function withdraw(member)
  local raw = redis.call('HGET', KEYS[2], member)
  if not raw then return end
  local entry = string.match(raw, '^[^\\31]*\\31[^\\31]*\\31[^\\31]*\\31(.*)$')
  if redis.call('ZREM', KEYS[1], entry) == 0 then return end  -- admitted meanwhile
  out[#out + 1] = member
  out[#out + 1] = redis.call('HGET', KEYS[3], member)
  redis.call('HDEL', KEYS[2], member)
  redis.call('HDEL', KEYS[3], member)
  redis.call('ZREM', KEYS[4], member)
end
if ARGV[1] == 'deadline' then
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[2], 'LIMIT', 0, 500)) do
    withdraw(m)
  end
else
  local tenant, prefix = ARGV[2], ARGV[3]
  for _, entry in ipairs(redis.call('ZRANGEBYLEX', KEYS[1], '[' .. tenant .. '\\31',
      '(' .. tenant .. '\\32')) do
    local member = string.sub(entry, #tenant + 19)
    if string.sub(member, 1, #prefix) == prefix then withdraw(member) end
  end
end
return out
"""

# KEYS: buckets, stats. ARGV: now, recovery_s, then scopes. An HTTP 429: halve each bucket's
# rate (down to a tenth), empty it, and count the slow-down.
_THROTTLE = (
    _BUCKET
    + """
local now, recovery_s = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 3, #ARGV do
  local tokens, factor = bucket(KEYS[1], ARGV[i], 1, 1, now, recovery_s)
  store_bucket(KEYS[1], ARGV[i], 0, now, math.max(0.1, factor / 2))
  redis.call('HINCRBY', KEYS[2], 'throttled:' .. ARGV[i], 1)
end
return 1
"""
)


@dataclass(frozen=True)
class Limits:
    """One tenant's or tool's limits; None leaves a limit off."""

    max_concurrency: int | None = None
    weight: float | None = None
    """Tenants only: share of capacity among tenants with waiting calls (default 1)."""
    rate: float | None = None
    """Calls per second, a token bucket shared by the fleet."""
    burst: int | None = None
    """Tokens the bucket holds (default 1: calls spaced evenly)."""
    tenant_rate: float | None = None
    """Tools only: calls per second per tenant (an upstream's limit per API key)."""
    tenant_burst: int | None = None

    def json(self) -> str:
        """As stored in Redis (and read by the admission script)."""
        return json.dumps({k: v for k, v in self.__dict__.items() if v is not None})

    @classmethod
    def parse(cls, raw: bytes | str | None) -> Limits:
        """From what ``json`` stored; an absent entry is no limits."""
        return cls(**json.loads(text(raw))) if raw else cls()


@dataclass(frozen=True)
class Waiting:
    """A call handed to admission: its identity, what limits it, and its command's bytes."""

    tenant_id: str
    run_id: str
    call_id: str
    attempt: int
    tool: str
    pool: str
    payload: str
    deadline_at: float | None = None

    @property
    def member(self) -> str:
        """The call attempt's name in every admission structure."""
        return member_of(self.tenant_id, self.run_id, self.call_id, self.attempt)


def waiting_command(
    command: ExecutionCommand, traceparent: str | None = None, *, issued_at: float | None = None
) -> Waiting:
    """An admitted copy of ``command`` (its outcome will free its slots), queued for admission,
    issued at ``issued_at`` if given (one copy of the command: copies cost 4 us each).

    The payload is ``pool SEP traceparent SEP command JSON``: whoever admits it publishes it
    to its pool's topic as it is, in the trace of the turn that queued it
    (``queued_command`` reads it back). Every version of the planner reads this format: a
    rolling upgrade has old and new planners admitting each other's calls."""
    update: dict[str, Any] = {"admitted": True}
    if issued_at is not None:
        update["issued_at"] = issued_at
    admitted = command.model_copy(update=update)
    payload = SEP.join((command.pool, traceparent or "", admitted.encode().decode()))
    return Waiting(
        command.tenant_id, command.run_id, command.call_id, command.attempt, command.tool_name,
        command.pool, payload, command.deadline_at,
    )  # fmt: skip


def _entries(calls: Sequence[Waiting]) -> list[Any]:
    """The script arguments of queued calls, six per call."""
    args: list[Any] = []
    for c in calls:
        deadline = "" if c.deadline_at is None else c.deadline_at
        args += [c.member, c.tenant_id, c.tool, c.pool, deadline, c.payload]
    return args


@dataclass(frozen=True)
class QueuedCommand:
    """A queued call's payload, read back: what to publish, where, and what to count."""

    pool: str
    command_json: str
    traceparent: str | None
    kind: str
    issued_at: float | None
    """When the command was issued (None when its JSON could not be read)."""

    def command(self) -> ExecutionCommand:
        """The command itself, decoded."""
        return ExecutionCommand.model_validate_json(self.command_json)


def queued_command(payload: str) -> QueuedCommand:
    """What ``waiting_command`` queued (also a payload queued without trace context)."""
    pool, rest = payload.split(SEP, 1)
    traceparent, raw = ("", rest) if rest.startswith("{") else rest.split(SEP, 1)
    # Two fields for the admission metrics, without validating the command: its worker does
    # (and dead-letters bytes it cannot read; the metrics must not stop them being sent).
    try:
        fields = orjson.loads(raw)
        kind, issued_at = str(fields.get("kind", "execute")), float(fields["issued_at"])
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
        kind, issued_at = "unreadable", None
    return QueuedCommand(pool, raw, traceparent or None, kind, issued_at)


def member_of(tenant_id: str, run_id: str, call_id: str, attempt: int) -> str:
    """The admission name of one call attempt (its slot is released by this name)."""
    return SEP.join((tenant_id, run_id, call_id, str(attempt)))


@dataclass(frozen=True)
class Admitted:
    """What one admission pass hands out."""

    calls: list[tuple[str, str]]
    """(member, payload) of each command to publish now."""
    refill_in_s: float | None = None
    """Seconds until a rate bucket that held a call back has a token (None: none did)."""


@dataclass(frozen=True)
class TenantView:
    """What ``toolfleet tenants list`` shows for one tenant."""

    tenant_id: str
    limits: Limits
    running: int
    waiting: int
    admitted_total: int


class Admission:
    """The admission queues, quotas and rate limits, in Redis (see the module docstring)."""

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        *,
        default_tenant: Limits = Limits(),
        lease_s: float = 900.0,
        publish_lease_s: float = 10.0,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.default_tenant = default_tenant
        self.lease_s = lease_s
        self.publish_lease_s = publish_lease_s
        self._enqueue = redis.register_script(_ENQUEUE)
        self._admit = redis.register_script(_ADMIT)
        self._withdraw = redis.register_script(_WITHDRAW)
        self._throttle = redis.register_script(_THROTTLE)

    @classmethod
    def of(cls, redis: Redis, keys: Keys, settings: Settings) -> Admission:
        """Admission as ``settings`` configure it (defaults for tenants nobody configured)."""
        default = Limits(
            max_concurrency=settings.tenant_max_concurrency,
            weight=settings.tenant_weight,
            rate=settings.tenant_rate,
            burst=settings.tenant_burst,
        )
        return cls(redis, keys, default_tenant=default, lease_s=settings.admission_lease_s)

    def _key(self, name: str) -> str:
        return self.keys.admission(name)

    async def enqueue(self, calls: Sequence[Waiting], now: float) -> int:
        """Queue calls (a call attempt already queued or admitted is skipped); how many."""
        if not calls:
            return 0
        args: list[Any] = [now, *_entries(calls)]
        names = ("active", "clock", "waiting", "info", "payloads", "deadlines", "seq")
        return int(await self._enqueue(keys=[self._key(n) for n in names], args=args))

    async def admit(
        self,
        now: float,
        *,
        release: Sequence[str] = (),
        published: Sequence[str] = (),
        enqueue: Sequence[Waiting] = (),
        max_calls: int = 1000,
    ) -> Admitted:
        """Free the slots of ``release``d calls, confirm ``published`` ones, queue
        ``enqueue``d ones, then admit what can run: (member, payload) of each command to
        publish now, fairest first (also those a planner admitted and did not confirm within
        the publish lease), and when a rate limit that held a call back has a token again."""
        names = (
            "active", "clock", "waiting", "info", "payloads", "deadlines", "running",
            "admitted", "pending", "tenants", "tools", "buckets", "workers", "slots", "seq",
        )  # fmt: skip
        args: list[Any] = [
            now, max_calls, self.lease_s, self.publish_lease_s, self.default_tenant.json(),
            RATE_SAFETY, RECOVERY_S, len(release), *release, len(published), *published,
            len(enqueue), *_entries(enqueue),
        ]  # fmt: skip
        flat = await self._admit(keys=[self._key(n) for n in names], args=args)
        retry = text(flat[0])
        calls = [(text(flat[i]), text(flat[i + 1])) for i in range(1, len(flat), 2)]
        return Admitted(calls, float(retry) if retry else None)

    async def withdraw_expired(self, now: float) -> list[tuple[str, str]]:
        """Take out the waiting calls whose turn deadline has passed: (member, payload)."""
        return await self._withdrawn("deadline", now)

    async def withdraw_run(self, tenant_id: str, run_id: str) -> list[tuple[str, str]]:
        """Take out every waiting call of a cancelled run: (member, payload)."""
        return await self._withdrawn("run", tenant_id, f"{tenant_id}{SEP}{run_id}{SEP}")

    async def _withdrawn(self, *args: Any) -> list[tuple[str, str]]:
        names = ("waiting", "info", "payloads", "deadlines")
        flat = await self._withdraw(keys=[self._key(n) for n in names], args=list(args))
        return [(text(flat[i]), text(flat[i + 1])) for i in range(0, len(flat), 2)]

    async def throttle(self, tenant_id: str, tool: str, now: float) -> None:
        """An HTTP 429 from ``tool``: slow its buckets (the tool's and its per-tenant one)."""
        scopes = [f"o:{tool}", f"to:{tenant_id}{SEP}{tool}"]
        await self._throttle(
            keys=[self._key("buckets"), self._key("stats")], args=[now, RECOVERY_S, *scopes]
        )

    async def register_worker(
        self, pool: str, worker_id: str, slots: int, ttl_s: float, now: float
    ) -> None:
        """A worker's slots count in its pool's capacity until ``now + ttl_s``."""
        name = f"{pool}{SEP}{worker_id}"
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(self._key("workers"), {name: now + ttl_s})
            pipe.hset(self._key("slots"), name, slots)
            await pipe.execute()

    async def unregister_worker(self, pool: str, worker_id: str) -> None:
        """A worker that stops takes its slots out of its pool's capacity at once."""
        name = f"{pool}{SEP}{worker_id}"
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrem(self._key("workers"), name)
            pipe.hdel(self._key("slots"), name)
            await pipe.execute()

    async def set_limits(self, kind: str, name: str, limits: Limits) -> None:
        """Store a tenant's or a tool's limits (``kind``: tenants | tools); live at once."""
        if limits == Limits():
            await self.redis.hdel(self._key(kind), name)
        else:
            await self.redis.hset(self._key(kind), name, limits.json())

    async def limits(self, kind: str) -> dict[str, Limits]:
        """Every configured tenant's or tool's limits."""
        raw = await self.redis.hgetall(self._key(kind))
        return {text(k): Limits.parse(v) for k, v in raw.items()}

    async def tenants(self) -> list[TenantView]:
        """Configured tenants and tenants with calls running or waiting, by name."""
        configured = await self.limits("tenants")
        running = {
            text(k): int(v) for k, v in (await self.redis.hgetall(self._key("running"))).items()
        }
        names = set(configured) | {
            k.removeprefix(p) for k in running for p in ("t:", "admitted:") if k.startswith(p)
        }
        ordered = sorted(names)
        waiting = await asyncio.gather(
            *(
                self.redis.zlexcount(self._key("waiting"), f"[{name}{SEP}", f"({name}\x20")
                for name in ordered
            )
        )
        return [
            TenantView(
                name,
                configured.get(name, Limits()),
                running.get(f"t:{name}", 0),
                int(count),
                running.get(f"admitted:{name}", 0),
            )
            for name, count in zip(ordered, waiting, strict=True)
        ]

    async def pool_capacity(self, now: float) -> dict[str, int]:
        """Slots per pool, of the workers registered now."""
        live = await self.redis.zrangebyscore(self._key("workers"), now, "+inf")
        slots = await self.redis.hgetall(self._key("slots"))
        capacity: dict[str, int] = {}
        for raw in live:
            name = text(raw) if isinstance(raw, bytes | str) else str(raw)
            pool = name.split(SEP, 1)[0]
            capacity[pool] = capacity.get(pool, 0) + int(slots.get(name.encode(), 0))
        return capacity
