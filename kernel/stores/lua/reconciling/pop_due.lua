-- Take every due action of one slot group atomically, so two reconcilers never both run one
-- at a time (ReconcileState.pop_due). KEYS: the group's schedule. ARGV: now, lease end.
-- Returns at most 100 due actions (JSON), each left in the schedule, due again at the lease's
-- end: an action is removed once it was carried out (done_due.lua), so a reconciler that dies
-- with it in hand, or never hears this reply, does not lose it.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 100)
for _, action in ipairs(due) do redis.call('ZADD', KEYS[1], 'XX', ARGV[2], action) end
return due
