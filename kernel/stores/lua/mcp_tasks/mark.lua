-- Set fields of an existing MCP door record (McpTasks.mark_submitted), never recreating one
-- that expired.
-- KEYS: the record's hash. ARGV: field/value pairs. Returns 1 when set, 0 when gone.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
