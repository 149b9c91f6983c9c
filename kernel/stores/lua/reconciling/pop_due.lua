-- Pop every due action of one slot group atomically, so two reconcilers never both run one
-- (ReconcileState.pop_due). KEYS: the group's schedule. ARGV: now. Returns at most 100 due
-- actions (JSON), removed from the schedule.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 100)
if #due > 0 then redis.call('ZREM', KEYS[1], unpack(due)) end
return due
