-- Drain or undrain. ARGV: prefix, host_id, new_state (up|draining), now_ms
-- Returns {status, seated ids...}; status ok | not_found | down.
local h, new, now = ARGV[2], ARGV[3], ARGV[4]
local key = k_host(h)
local f = redis.call('HMGET', key, 'state', 'pool')
if f[1] == false then return {'not_found'} end
if f[1] == 'down' then return {'down'} end
redis.call('HSET', key, 'state', new)
if new == 'draining' then  -- a draining host keeps no staged session: they go elsewhere
  for _, sid in ipairs(redis.call('SMEMBERS', k_host_sessions(h))) do
    local s = hgetall(k_session(sid))
    if s['state'] == 'staged' then drop_staged(sid, s, 'host_draining') end
  end
end
refresh_host(h)
local out = {'ok'}
if new == 'up' then
  for _, s in ipairs(pump(f[2], now)) do table.insert(out, s) end
end
restage(f[2], now)
return out
