-- An HTTP 429 (Admission.throttle): halve each bucket's rate (down to a tenth), empty it,
-- and count the slow-down. KEYS: buckets, stats. ARGV: now, recovery_s, then the scopes.
--@include lib/bucket.lua
-- luacheck: read globals bucket store_bucket
local now, recovery_s = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 3, #ARGV do
  local _, factor = bucket(KEYS[1], ARGV[i], 1, 1, now, recovery_s)
  store_bucket(KEYS[1], ARGV[i], 0, now, math.max(0.1, factor / 2))
  redis.call('HINCRBY', KEYS[2], 'throttled:' .. ARGV[i], 1)
end
return 1
