-- ARGV: prefix, host_id, now_ms, lease_ttl_ms, telemetry_json
-- Returns {status, assigned session ids...}; status ok | unknown (the node must re-register) |
-- retired (removed by an admin or the autoscaler: the node must stop, not re-register).
local h, now, ttl, telemetry = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if redis.call('EXISTS', k_retired(h)) == 1 then return {'retired'} end
local key = k_host(h)
local state = redis.call('HGET', key, 'state')
if state == false or state == 'down' then return {'unknown'} end
redis.call('SET', k_lease(h), now, 'PX', ttl)
redis.call('HSET', key, 'heartbeat_ms', now, 'telemetry', telemetry)
local out = {'ok'}
for _, s in ipairs(redis.call('SMEMBERS', k_host_sessions(h))) do table.insert(out, s) end
return out
