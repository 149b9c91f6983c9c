-- Token buckets of the rate limits, one field each of the buckets hash: "tokens,ts,factor".
-- bucket: the tokens a bucket holds at ``now`` (refilled at ``rate`` per second times its
-- factor, up to ``burst``) and its factor (after an HTTP 429 it climbs back to 1 over
-- ``recovery_s``). store_bucket: write what a bucket holds at ``now``.
-- luacheck: ignore 211/bucket 211/store_bucket
local function bucket(buckets, scope, rate, burst, now, recovery_s)
  local tokens, ts, factor = burst, now, 1
  local raw = redis.call('HGET', buckets, scope)
  if raw then
    local a, b, c = string.match(raw, '([^,]+),([^,]+),([^,]+)')
    tokens, ts, factor = tonumber(a), tonumber(b), tonumber(c)
  end
  local elapsed = math.max(0, now - ts)
  factor = math.min(1, factor + elapsed / recovery_s)
  tokens = math.min(burst, tokens + elapsed * rate * factor)
  return tokens, factor
end
local function store_bucket(buckets, scope, tokens, now, factor)
  redis.call('HSET', buckets, scope, tokens .. ',' .. now .. ',' .. factor)
end
