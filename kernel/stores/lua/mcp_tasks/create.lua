-- Create an MCP door record for a call (McpTasks.create), or find the one its run has.
-- KEYS: the record's hash. ARGV: the call's fingerprint (tool and arguments), ttl in
-- milliseconds (0: kept as long as the ledger keeps runs for ever), '1' when the call is a
-- task, then field/value pairs of a new record.
-- Returns {verdict, field, value, ...}: 'new' (written), 'same' (a record of the same call
-- was there: a retry; a task flag is added to it) or 'conflict' (another call's), each with
-- the record as it is now.
local fingerprint = redis.call('HGET', KEYS[1], 'fingerprint')
local verdict = 'new'
if fingerprint then
  if fingerprint ~= ARGV[1] then
    verdict = 'conflict'
  else
    verdict = 'same'
    if ARGV[3] == '1' then redis.call('HSET', KEYS[1], 'task', '1') end
  end
else
  redis.call('HSET', KEYS[1], 'fingerprint', ARGV[1], 'task', ARGV[3], unpack(ARGV, 4))
  if tonumber(ARGV[2]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
end
local found = redis.call('HGETALL', KEYS[1])
table.insert(found, 1, verdict)
return found
