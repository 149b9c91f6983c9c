-- Start reconciling one attempt of a call, unless it already is (ReconcileState.claim).
-- KEYS: the call's reconciliation state. ARGV: the attempt's fencing token, and the claimant
-- (the record that asks: topic, partition and offset; '' for none). Returns 1 when this
-- claim starts it (probes and the awaited probe reset), or when the claimant that started it
-- asks again (its reply was lost, or its reconciler died before acting: it goes on where it
-- stands); 0 when that attempt or a later one is already being reconciled by another record
-- (a duplicate outcome).
local token = tonumber(redis.call('HGET', KEYS[1], 'token') or '-1')
local claimant = ARGV[2] or ''
if token > tonumber(ARGV[1]) then return 0 end
if token == tonumber(ARGV[1]) then
  if claimant ~= '' and redis.call('HGET', KEYS[1], 'claimant') == claimant then return 1 end
  return 0
end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'probes', 0, 'awaiting_probe', 0,
  'status', 'reconciling', 'claimant', claimant)
return 1
