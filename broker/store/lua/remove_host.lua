-- Deregister a host. ARGV: prefix, host_id, force (0|1), reason, now_ms, retire_ttl_s
-- Without force a host with live sessions is not removed.  With retire_ttl_s > 0 the id is
-- retired: register_host and heartbeat refuse it until the marker expires, so a node that is
-- still running (its provider has not stopped it yet) cannot bring the host back on its next
-- heartbeat.  Returns {status, ended ids...}; status removed | busy | not_found.
local h, force, reason, now, retire_ttl = ARGV[2], ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6])
local key = k_host(h)
local pool = redis.call('HGET', key, 'pool')
if pool == false then return {'not_found'} end
local sessions = redis.call('SMEMBERS', k_host_sessions(h))
local live = 0  -- staged sessions (nobody's) never keep a host
for _, sid in ipairs(sessions) do
  if redis.call('HGET', k_session(sid), 'state') ~= 'staged' then live = live + 1 end
end
if live > 0 and force ~= '1' then return {'busy', tostring(live)} end
local out = {'removed'}
for _, sid in ipairs(sessions) do
  local _, st = end_session(sid, reason, now)
  if st ~= 'dropped' then table.insert(out, sid) end
end
unaccount_host(h)
redis.call('DEL', key, k_lease(h), k_host_sessions(h))
redis.call('SREM', k_pool_hosts(pool), h)
redis.call('SREM', k_hosts(), h)
redis.call('ZREM', k_due_leases(), h)
redis.call('ZREM', k_due_purge(), h)
if retire_ttl ~= nil and retire_ttl > 0 then redis.call('SET', k_retired(h), now, 'EX', retire_ttl) end
restage(pool, now)  -- its staged sessions are staged again elsewhere
return out
