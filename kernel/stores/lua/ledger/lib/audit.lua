-- A call's plain run (planned, dispatched, started, finished, or settled without running) is
-- recorded in its entry alone, each event's facts in fields of their own. plain_events
-- writes them as the audit chain would hold them. keep is for the first event beyond the
-- plain run (an approval, probe, retry, compensation, verdict): it moves the plain run's
-- events into the chain, and from then on every event is appended there. The call is kept:
-- it never expires. Most calls never get a chain: an append per transition was a fifth of
-- the ledger's Redis time, and the chain's key most of a finished call's memory.
-- luacheck: ignore 211/plain_events 211/keep
local function plain_events(call)
  local h = redis.call('HMGET', call, 'created_at', 'dispatched_at', 'attempts',
    'fencing_token', 'dispatch_reason', 'started_at', 'worker_id', 'finished_at', 'outcome',
    'settled_at')
  local events = {}
  if h[1] then events[#events + 1] = cjson.encode({event='planned', at=tonumber(h[1])}) end
  if h[2] then
    events[#events + 1] = cjson.encode({event='dispatched', attempt=tonumber(h[3]),
      fencing_token=tonumber(h[4]), reason=h[5] or 'planned', at=tonumber(h[2])})
  end
  if h[6] then
    events[#events + 1] = cjson.encode({event='started', worker=h[7],
      fencing_token=tonumber(h[4]), at=tonumber(h[6])})
  end
  local ref = redis.call('HMGET', call, 'upstream_ref', 'upstream_ref_at')
  if ref[1] and ref[2] then
    events[#events + 1] = cjson.encode({event='upstream_ref', ref=ref[1], at=tonumber(ref[2])})
  end
  if h[8] and h[9] then
    local o = cjson.decode(h[9])
    events[#events + 1] = cjson.encode({event='finished', status=o.status, effect=o.effect,
      fencing_token=tonumber(h[4]), at=tonumber(h[8])})
  end
  if h[10] then
    events[#events + 1] = cjson.encode({event='settled_without_running', at=tonumber(h[10])})
  end
  return events
end
local function keep(call, audit)
  if redis.call('HGET', call, 'keep') then return end
  if redis.call('LLEN', audit) == 0 then
    local events = plain_events(call)
    if #events > 0 then redis.call('RPUSH', audit, unpack(events)) end
  end
  redis.call('HSET', call, 'keep', 1)
  redis.call('PERSIST', call)
  redis.call('PERSIST', audit)
end
