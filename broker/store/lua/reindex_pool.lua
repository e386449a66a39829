-- Rebuild one pool's indexes from its records: placement index, counters, lease and session
-- deadlines.  ARGV: prefix, pool, now_ms.  O(hosts + sessions of the pool): run once when the
-- index layout is new (an upgrade from a broker without indexes) or to repair.  Returns the
-- number of hosts and sessions indexed.
local pool, now = ARGV[2], tonumber(ARGV[3])
local cfg = pool_cfg(pool)
if cfg == nil then return {0, 0} end
redis.call('DEL', k_avail(pool), k_stats(pool), k_avail_class(pool, 'c'), k_avail_class(pool, 's'))
local nh, ns = 0, 0
local function index_session(sid)
  local s = read_clock(sid)
  if s ~= nil and s.state ~= 'ended' and s.state ~= 'staged' then
    count_session(pool, nil, s.state)
    ns = ns + 1
  end
  schedule(sid)
end
for _, h in ipairs(redis.call('SMEMBERS', k_pool_hosts(pool))) do
  local key = k_host(h)
  if redis.call('EXISTS', key) == 1 then
    nh = nh + 1
    redis.call('HSET', key, 'acct', '')
    set_seats(h, cfg)
    local st = redis.call('HGET', key, 'state')
    if st ~= 'down' then
      redis.call('ZADD', k_due_leases(), now + math.max(redis.call('PTTL', k_lease(h)), 0), h)
    end
    refresh_host(h)
    for _, sid in ipairs(redis.call('SMEMBERS', k_host_sessions(h))) do index_session(sid) end
  end
end
for _, sid in ipairs(redis.call('LRANGE', k_queue(pool), 0, -1)) do index_session(sid) end
-- down hosts left the pool's set but count as down until their record is dropped
for _, h in ipairs(redis.call('ZRANGE', k_due_purge(), 0, -1)) do
  local f = redis.call('HMGET', k_host(h), 'pool', 'state')
  if f[1] == pool and f[2] == 'down' then
    redis.call('HSET', k_host(h), 'acct', '')
    refresh_host(h)
    nh = nh + 1
  end
end
return {nh, ns}
