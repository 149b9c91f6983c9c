-- Take waiting calls out of the queue (Admission.withdraw_expired, withdraw_run): those past
-- their deadline, or every waiting call of one run. KEYS: waiting, info, payloads,
-- deadlines. ARGV: 'deadline', now | 'run', tenant, prefix (tenant \31 run \31). Returns a
-- flat list of member, payload of each call taken out.
local out = {}
local function withdraw(member)
  local raw = redis.call('HGET', KEYS[2], member)
  if not raw then return end
  local entry = string.match(raw, '^[^\31]*\31[^\31]*\31[^\31]*\31(.*)$')
  if redis.call('ZREM', KEYS[1], entry) == 0 then return end  -- admitted meanwhile
  out[#out + 1] = member
  out[#out + 1] = redis.call('HGET', KEYS[3], member)
  redis.call('HDEL', KEYS[2], member)
  redis.call('HDEL', KEYS[3], member)
  redis.call('ZREM', KEYS[4], member)
end
if ARGV[1] == 'deadline' then
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[2], 'LIMIT', 0, 500)) do
    withdraw(m)
  end
else
  local tenant, prefix = ARGV[2], ARGV[3]
  for _, entry in ipairs(redis.call('ZRANGEBYLEX', KEYS[1], '[' .. tenant .. '\31',
      '(' .. tenant .. '\32')) do
    local member = string.sub(entry, #tenant + 19)
    if string.sub(member, 1, #prefix) == prefix then withdraw(member) end
  end
end
return out
