-- Take one probe answer, ignoring duplicates (ReconcileState.take_probe). KEYS: the call's
-- reconciliation state. ARGV: the taker (the record that carries the answer: topic, partition
-- and offset; '' for none). Returns the number of probes answered so far, or -1 when no probe
-- answer was awaited. The record that took the last answer may take it again (its reply was
-- lost, or its reconciler died before acting on it): it gets the same count.
local taker = ARGV[1] or ''
if taker ~= '' and redis.call('HGET', KEYS[1], 'probe_taker') == taker then
  return tonumber(redis.call('HGET', KEYS[1], 'probes') or '0')
end
if redis.call('HGET', KEYS[1], 'awaiting_probe') ~= '1' then return -1 end
redis.call('HSET', KEYS[1], 'awaiting_probe', 0, 'probe_taker', taker)
return redis.call('HINCRBY', KEYS[1], 'probes', 1)
