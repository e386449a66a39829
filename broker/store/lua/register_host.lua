-- ARGV: prefix, host_id, pool, address, gpus_json, now_ms, lease_ttl_ms, version
-- Returns {status, seated ids...}; status registered | retired | wrong_pool | unknown_pool.
-- retired: remove_host retired this id (an admin or the autoscaler removed it) and the marker
-- has not expired; the node must not come back under this id.
local h, pool, address, gpus, now, ttl, version = ARGV[2], ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6]),
  tonumber(ARGV[7]), ARGV[8]
if redis.call('EXISTS', k_retired(h)) == 1 then return {'retired'} end
local cfg = pool_cfg(pool)
if cfg == nil then return {'unknown_pool'} end
local key = k_host(h)
local old = redis.call('HMGET', key, 'pool', 'state')
if old[1] ~= false and old[1] ~= pool then
  if redis.call('SCARD', k_host_sessions(h)) > 0 then return {'wrong_pool'} end
  unaccount_host(h)
  redis.call('SREM', k_pool_hosts(old[1]), h)
end
local state = 'up'
if old[2] == 'draining' then state = 'draining' end  -- an admin's drain survives a node restart
redis.call('PERSIST', key)
redis.call('HSET', key, 'pool', pool, 'address', address, 'gpus', gpus, 'state', state,
           'registered_ms', now, 'heartbeat_ms', now, 'version', version)
set_seats(h, cfg)
redis.call('SADD', k_pool_hosts(pool), h)
redis.call('SADD', k_hosts(), h)
redis.call('SET', k_lease(h), now, 'PX', ttl)
redis.call('ZADD', k_due_leases(), now + ttl, h)
redis.call('ZREM', k_due_purge(), h)
refresh_host(h)
local out = {'registered'}
for _, s in ipairs(pump(pool, now)) do table.insert(out, s) end
restage(pool, now)
return out
