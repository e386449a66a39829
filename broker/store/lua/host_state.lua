-- Drain or undrain. ARGV: prefix, host_id, new_state (up|draining), now_ms
-- Returns {status, seated ids...}; status ok | not_found | down.
local h, new, now = ARGV[2], ARGV[3], ARGV[4]
local key = k_host(h)
local f = redis.call('HMGET', key, 'state', 'pool')
if f[1] == false then return {'not_found'} end
if f[1] == 'down' then return {'down'} end
redis.call('HSET', key, 'state', new)
refresh_host(h)
local out = {'ok'}
if new == 'up' then
  for _, s in ipairs(pump(f[2], now)) do table.insert(out, s) end
end
return out
