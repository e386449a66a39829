-- Create or replace a pool's config. ARGV: prefix, pool, now_ms, field, value, field, value...
-- Returns {created|updated, seated ids...}: a bigger pool may seat queued sessions at once.
-- A change re-counts the pool's hosts under the new seat rules and strategy (O(hosts), an admin
-- action) and, when a timeout changed, re-computes its live sessions' deadlines.
local pool, now = ARGV[2], ARGV[3]
local key = k_pool(pool)
local existed = redis.call('EXISTS', key)
local before = redis.call('HMGET', key, unpack(TIMEOUTS))
redis.call('DEL', key)
for i = 4, #ARGV, 2 do redis.call('HSET', key, ARGV[i], ARGV[i + 1]) end
redis.call('SADD', k_pools(), pool)
local out = {'created'}
if existed == 1 then
  out[1] = 'updated'
  local cfg = pool_cfg(pool)
  local hosts = redis.call('SMEMBERS', k_pool_hosts(pool))
  for _, h in ipairs(hosts) do
    set_seats(h, cfg)
    refresh_host(h)
  end
  local after = redis.call('HMGET', key, unpack(TIMEOUTS))
  local changed = false
  for i = 1, #TIMEOUTS do if before[i] ~= after[i] then changed = true end end
  if changed then
    for _, h in ipairs(hosts) do
      for _, sid in ipairs(redis.call('SMEMBERS', k_host_sessions(h))) do schedule(sid) end
    end
    for _, sid in ipairs(redis.call('LRANGE', k_queue(pool), 0, -1)) do schedule(sid) end
  end
end
for _, s in ipairs(pump(pool, now)) do table.insert(out, s) end
restage(pool, now)  -- the staged setting: stage more on free seats, or drop the extra
return out
