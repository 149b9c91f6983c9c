-- Mark a task cancelled (McpTasks.cancel), unless its call moved on since the door read it.
-- KEYS: the record's hash, the call's ledger entry (same slot group). ARGV: when (seconds),
-- the reason, the ledger entry's outcome as the door read it ('' when it had none).
-- Returns 'missing' (no record), 'already' (cancelled before: the first reason stays),
-- 'moved' (the call's outcome changed: read it again and decide again) or 'cancelled'.
if redis.call('EXISTS', KEYS[1]) == 0 then return 'missing' end
if redis.call('HGET', KEYS[1], 'cancelled_at') then return 'already' end
local outcome = redis.call('HGET', KEYS[2], 'outcome') or ''
if outcome ~= ARGV[3] then return 'moved' end
redis.call('HSET', KEYS[1], 'cancelled_at', ARGV[1], 'cancel_reason', ARGV[2])
return 'cancelled'
