-- Start reconciling one attempt of a call, unless it already is (ReconcileState.claim).
-- KEYS: the call's reconciliation state. ARGV: the attempt's fencing token. Returns 1 when
-- this claim starts it (probes and the awaited probe reset), 0 when that attempt or a later
-- one is already being reconciled.
local token = tonumber(redis.call('HGET', KEYS[1], 'token') or '-1')
if token >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'probes', 0, 'awaiting_probe', 0,
  'status', 'reconciling')
return 1
