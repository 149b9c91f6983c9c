-- The running attempt sent a heartbeat (Ledger.heartbeat): keep its newest details and extend
-- its holder's lease. KEYS: entry, lease index. ARGV: token, worker, lease_s, lease member,
-- details json. Returns 0 when the attempt is no longer the current one or no longer this
-- worker's (fenced off, finished), else 1.
local h = redis.call('HMGET', KEYS[1], 'state', 'fencing_token', 'worker_id')
if h[1] ~= 'started' or tonumber(h[2]) ~= tonumber(ARGV[1]) or h[3] ~= ARGV[2] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local expiry = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'heartbeat', ARGV[5], 'heartbeat_at', now,
  'lease_until', expiry)
redis.call('ZADD', KEYS[2], 'XX', expiry, ARGV[4])
return 1
