-- issue: issue an attempt of the call ``call`` (audit chain ``audit``); ``h`` is its HMGET
-- of state, attempts, fencing_token, keep. Unforced (the planner) it is idempotent: a
-- dispatched call gets its current attempt back, a started or finished one nothing. Forced
-- (a retry the reconciler decided after a probe proved the call not applied) the fencing
-- token is bumped, so the outcome of any older holder is ignored; it also reopens a call
-- whose stored outcome is an unknown effect. Returns {attempt, token}, or a negative
-- attempt when no command should be sent.
-- plan: record a new entry in state planned from its fields (fingerprint, idem key, run,
-- turn, tool, pool, arguments, index, policy, trace id) and return its h.
--@include audit.lua
-- luacheck: read globals keep
-- luacheck: ignore 211/issue 211/plan
local function issue(call, audit, h, force, now, reason, after)
  local state = h[1]
  if force and tonumber(h[3]) ~= after then
    if state == 'dispatched' and tonumber(h[3]) == after + 1 then
      return {tonumber(h[2]), tonumber(h[3])}
    end
    return {-4, 0}
  end
  if not force then
    if state == 'committed' or state == 'finished' then return {-2, 0} end
    if state == 'dispatched' then return {tonumber(h[2]), tonumber(h[3])} end
    if state ~= 'planned' then return {-3, 0} end
  end
  if force then keep(call, audit) end  -- before the previous attempt's fields change
  local attempt, token = tonumber(h[2]) + 1, tonumber(h[3]) + 1
  if force or h[4] then
    redis.call('HSET', call, 'state', 'dispatched', 'attempts', attempt, 'fencing_token', token)
    redis.call('RPUSH', audit, cjson.encode({event='dispatched', attempt=attempt,
      fencing_token=token, reason=reason, at=now}))
  elseif reason == 'planned' then
    redis.call('HSET', call, 'state', 'dispatched', 'attempts', attempt, 'fencing_token', token,
      'dispatched_at', now)
  else
    redis.call('HSET', call, 'state', 'dispatched', 'attempts', attempt, 'fencing_token', token,
      'dispatched_at', now, 'dispatch_reason', reason)
  end
  return {attempt, token}
end
local function plan(call, now, f)
  redis.call('HSET', call, 'fingerprint', f[1], 'idempotency_key', f[2], 'run_id', f[3],
    'turn_id', f[4], 'tool_name', f[5], 'pool', f[6], 'state', 'planned', 'attempts', 0,
    'fencing_token', 0, 'created_at', now, 'arguments', f[7], 'index', f[8], 'policy', f[9],
    'trace_id', f[10])
  return {'planned', '0', '0'}
end
