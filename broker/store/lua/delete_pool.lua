-- ARGV: prefix, pool.  Returns deleted | not_found | busy (hosts or live sessions remain).
local pool = ARGV[2]
if redis.call('EXISTS', k_pool(pool)) == 0 then return 'not_found' end
if redis.call('SCARD', k_pool_hosts(pool)) > 0 or redis.call('LLEN', k_queue(pool)) > 0 then
  return 'busy'
end
redis.call('DEL', k_pool(pool), k_queue(pool), k_pool_hosts(pool), k_avail(pool), k_stats(pool),
           k_rollout(pool), k_avail_class(pool, 'c'), k_avail_class(pool, 's'), k_staged(pool), k_waits(pool))
redis.call('SREM', k_pools(), pool)
return 'deleted'
