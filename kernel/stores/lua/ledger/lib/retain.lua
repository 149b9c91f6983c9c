-- A committed call expires after retention_s (0: never) unless it is kept.
-- luacheck: ignore 211/retain
local function retain(call, audit, retention_s)
  if retention_s > 0 and not redis.call('HGET', call, 'keep') then
    redis.call('EXPIRE', call, retention_s)
    redis.call('EXPIRE', audit, retention_s)
  end
end
