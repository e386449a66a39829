-- Start, change or stop a pool's canary rollout in Redis (the policy itself lives in SQL,
-- broker/rollout).  ARGV: prefix, pool, candidate_version, share_pct.  An empty version stops it:
-- the rollout hash and both class indexes go.  Otherwise the hash gets the version and share (its
-- seating counter n is kept) and the class indexes are rebuilt from the pool's avail index,
-- O(hosts with a free seat): an admin or rollout-loop action, not a per-seating cost.
-- Returns ok | unknown_pool.
local pool, version, share = ARGV[2], ARGV[3], ARGV[4]
if redis.call('EXISTS', k_pool(pool)) == 0 then return 'unknown_pool' end
redis.call('DEL', k_avail_class(pool, 'c'), k_avail_class(pool, 's'))
if version == '' then
  redis.call('DEL', k_rollout(pool))
  return 'ok'
end
redis.call('HSET', k_rollout(pool), 'version', version, 'share_pct', share)
local flat = redis.call('ZRANGE', k_avail(pool), 0, -1, 'WITHSCORES')
for i = 1, #flat, 2 do
  local h = flat[i]
  local cls = 's'
  if redis.call('HGET', k_host(h), 'version') == version then cls = 'c' end
  redis.call('ZADD', k_avail_class(pool, cls), flat[i + 1], h)
end
return 'ok'
