-- An action taken from the schedule was carried out (ReconcileState.done): remove it, unless
-- it was scheduled again meanwhile (its score is no longer the lease's end it was taken with).
-- KEYS: the group's schedule. ARGV: the action (JSON), its lease's end. Returns 1 if removed.
local at = redis.call('ZSCORE', KEYS[1], ARGV[1])
if at and tonumber(at) == tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
