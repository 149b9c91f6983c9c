-- Extend the holder's lease (Ledger.renew). KEYS: entry, lease index. ARGV: token, worker,
-- lease_s, lease member. Returns 0 when the attempt is no longer this worker's, else 1.
local h = redis.call('HMGET', KEYS[1], 'state', 'fencing_token', 'worker_id')
if h[1] ~= 'started' or tonumber(h[2]) ~= tonumber(ARGV[1]) or h[3] ~= ARGV[2] then return 0 end
local t = redis.call('TIME')
local expiry = tonumber(t[1]) + tonumber(t[2]) / 1e6 + ARGV[3]
redis.call('HSET', KEYS[1], 'lease_until', expiry)
redis.call('ZADD', KEYS[2], 'XX', expiry, ARGV[4])
return 1
