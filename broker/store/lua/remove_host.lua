-- Deregister a host. ARGV: prefix, host_id, force (0|1), reason, now_ms
-- Without force a host with live sessions is not removed.  Returns {status, ended ids...};
-- status removed | busy | not_found.
local h, force, reason, now = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local key = k_host(h)
local pool = redis.call('HGET', key, 'pool')
if pool == false then return {'not_found'} end
local sessions = redis.call('SMEMBERS', k_host_sessions(h))
if #sessions > 0 and force ~= '1' then return {'busy', tostring(#sessions)} end
local out = {'removed'}
for _, sid in ipairs(sessions) do end_session(sid, reason, now); table.insert(out, sid) end
redis.call('DEL', key, k_lease(h), k_host_sessions(h))
redis.call('SREM', k_pool_hosts(pool), h)
redis.call('SREM', k_hosts(), h)
return out
