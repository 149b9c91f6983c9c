-- Take one probe answer, ignoring duplicates (ReconcileState.take_probe). KEYS: the call's
-- reconciliation state. Returns the number of probes answered so far, or -1 when no probe
-- answer was awaited.
if redis.call('HGET', KEYS[1], 'awaiting_probe') ~= '1' then return -1 end
redis.call('HSET', KEYS[1], 'awaiting_probe', 0)
return redis.call('HINCRBY', KEYS[1], 'probes', 1)
