-- Workers ask to run attempts, a batch at once (Ledger.begin, SlotGroupBatches). KEYS, four
-- per call: entry, audit chain, lease index, cancellation marker. ARGV, five per call:
-- token, worker, lease_s, lease member, the tool version it runs ('' for none:
-- compensations). Returns verdict, stored outcome ('' unless done) per call. Verdicts: run
-- (started is written), done, stale, busy (another holder's lease runs), unknown (a
-- holder's lease ran out: its effect is unknown), deferred (an external system completes
-- it), missing, cancelled.
local function begin(entry, audit, leases, cancelled, a, now)
  local h = redis.call('HMGET', entry, 'state', 'fencing_token', 'lease_until', 'outcome',
    'keep')
  local state, token = h[1], tonumber(h[2])
  if not state then return 'missing', '' end
  if state == 'finished' or state == 'committed' then return 'done', h[4] or '' end
  if state == 'deferred' then return 'deferred', '' end
  if tonumber(ARGV[a]) < token then return 'stale', '' end
  if state == 'started' then
    if tonumber(h[3] or '0') > now then return 'busy', '' end
    return 'unknown', ''
  end
  if redis.call('EXISTS', cancelled) == 1 then return 'cancelled', '' end
  local lease_until = now + tonumber(ARGV[a + 2])
  redis.call('HSET', entry, 'state', 'started', 'worker_id', ARGV[a + 1],
    'lease_until', lease_until, 'started_at', now)
  if ARGV[a + 4] ~= '' then redis.call('HSET', entry, 'tool_version', ARGV[a + 4]) end
  redis.call('ZADD', leases, lease_until, ARGV[a + 3])
  if h[5] then
    redis.call('RPUSH', audit, cjson.encode({event='started', worker=ARGV[a + 1],
      fencing_token=token, at=now}))
  end
  return 'run', ''
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local out = {}
for i = 1, #KEYS, 4 do
  local verdict, outcome = begin(KEYS[i], KEYS[i + 1], KEYS[i + 2], KEYS[i + 3],
    (i - 1) / 4 * 5 + 1, now)
  out[#out + 1] = verdict
  out[#out + 1] = outcome
end
return out
