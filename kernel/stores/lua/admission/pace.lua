-- A rate-limited call about to start (Admission.pace): a rate holds where the upstream sees
-- it, at the start. Admission's buckets space admissions, but the time from admission to start
-- varies (a worker's queue, a slow consumer), and calls admitted apart can start together.
-- Each scope keeps a log of the starts in its window; a start that would exceed the scope's
-- limit waits until the oldest one it needs leaves the window.
-- KEYS: tenants, tools, then one start log per scope. ARGV: now, member, slack (seconds added
-- to each window: a start is logged a little before its tool begins), default tenant json,
-- then the scopes ('t:tenant', 'o:tool', 'to:tenant\31tool'), in the order of their logs.
-- Returns '' once the start is logged in every scope, or the seconds to wait (nothing logged).
local tenants, tools = KEYS[1], KEYS[2]
local now, member, slack = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local default_tenant = cjson.decode(ARGV[4])

local function number(v)
  if v == nil or v == cjson.null then return nil end
  return tonumber(v)
end
local function config(hash, name, default)
  local merged = {}
  for k, v in pairs(default) do merged[k] = v end
  local raw = redis.call('HGET', hash, name)
  if raw then
    for k, v in pairs(cjson.decode(raw)) do merged[k] = v end
  end
  return merged
end
-- The scope's declared rate and burst (nil when the scope has no rate now).
local function limits_of(scope)
  local kind, name = string.match(scope, '^([^:]+):(.*)$')
  if kind == 't' then
    local c = config(tenants, name, default_tenant)
    return number(c.rate), number(c.burst)
  elseif kind == 'o' then
    local c = config(tools, name, {})
    return number(c.rate), number(c.burst)
  elseif kind == 'to' then
    local tool = string.match(name, '\31(.*)$')
    local c = config(tools, tool, {})
    return number(c.tenant_rate), number(c.tenant_burst)
  end
  return nil, nil
end

local checked, wait = {}, 0
for i = 5, #ARGV do
  local log, scope = KEYS[i - 2], ARGV[i]
  local rate, burst = limits_of(scope)
  if rate and rate > 0 then
    -- A rate under one per second is one start per 1/rate seconds.
    local period = math.max(1, 1 / rate)
    local limit = math.max(math.floor(rate * period + 1e-9), burst or 1)
    local window = period + slack
    redis.call('ZREMRANGEBYSCORE', log, '-inf', '(' .. (now - window))
    redis.call('ZREM', log, member)  -- a redelivered start is counted once
    local n = redis.call('ZCARD', log)
    if n >= limit then
      local oldest = redis.call('ZRANGE', log, n - limit, n - limit, 'WITHSCORES')
      wait = math.max(wait, tonumber(oldest[2]) + window - now)
    end
    checked[#checked + 1] = {log, window}
  end
end
if wait > 0 then return tostring(wait) end
for _, c in ipairs(checked) do
  redis.call('ZADD', c[1], now, member)
  redis.call('PEXPIRE', c[1], math.ceil(c[2] * 1000) + 1000)
end
return ''
