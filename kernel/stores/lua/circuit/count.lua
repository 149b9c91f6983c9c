-- Count executed calls in a tool version's sliding window (CircuitBreaker.count, for the
-- worker's step after publishing). KEYS: the version's window (bucket counts), state and
-- recent calls. ARGV: now, window_s, min_calls, error rate, buckets, how many of the calls
-- failed, then the calls' ids. Returns the window's call ids when these calls opened the
-- circuit, else {}.
--
-- Counting a call is O(1): the window is counted in buckets (a bucket leaves the window as a
-- whole) and summed only when failures come in.
local function count_calls(window, state, recent, now, ids, failed, window_s, min_calls, rate, nb)
  local b = math.floor(now / (window_s / nb))
  local n = redis.call('HINCRBY', window, b .. ':n', #ids)
  if failed > 0 then redis.call('HINCRBY', window, b .. ':f', failed) end
  local listed = 0
  for first = 1, #ids, 500 do  -- unpack has a stack limit: push in slices
    local slice = {}
    for i = first, math.min(#ids, first + 499) do slice[#slice + 1] = now .. '|' .. ids[i] end
    listed = redis.call('LPUSH', recent, unpack(slice))
  end
  if listed > 1100 then redis.call('LTRIM', recent, 0, 999) end
  if n == #ids then
    -- A new bucket (once per window / buckets, not on every call): forget the one that left
    -- the window and keep both keys alive for another window.
    local ttl = math.ceil(window_s) + 60
    redis.call('HDEL', window, (b - nb) .. ':n', (b - nb) .. ':f')
    redis.call('EXPIRE', window, ttl)
    redis.call('EXPIRE', recent, ttl)
  end
  -- Successes never raise the error rate: the window is evaluated when failures come in
  -- (successes that only bring it up to min_calls leave the decision to the next failure).
  if failed == 0 or redis.call('EXISTS', state) == 1 then return {} end
  local calls, fails = 0, 0
  for i = 0, nb - 1 do
    calls = calls + tonumber(redis.call('HGET', window, (b - i) .. ':n') or '0')
    fails = fails + tonumber(redis.call('HGET', window, (b - i) .. ':f') or '0')
  end
  if calls < min_calls or fails / calls < rate then return {} end
  redis.call('SET', state, cjson.encode({opened_at=now, failed=fails, calls=calls}))
  local opened = {}
  for _, entry in ipairs(redis.call('LRANGE', recent, 0, -1)) do
    local sep = string.find(entry, '|', 1, true)
    if tonumber(string.sub(entry, 1, sep - 1)) >= now - window_s then
      opened[#opened + 1] = string.sub(entry, sep + 1)
    end
  end
  return opened
end
local ids = {}
for i = 7, #ARGV do ids[#ids + 1] = ARGV[i] end
return count_calls(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[1]), ids, tonumber(ARGV[6]),
  tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))
