-- Drop down hosts whose record was kept long enough. ARGV: prefix, now_ms, limit
-- A host that registered again since is only taken off the list.  Returns the ids dropped.
local now, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for _, h in ipairs(redis.call('ZRANGEBYSCORE', k_due_purge(), '-inf', now, 'LIMIT', 0, limit)) do
  redis.call('ZREM', k_due_purge(), h)
  local f = redis.call('HMGET', k_host(h), 'state', 'pool')
  if f[1] == false or f[1] == 'down' then
    if f[2] and redis.call('EXISTS', k_pool(f[2])) == 1 then unaccount_host(h) end
    if f[2] then redis.call('SREM', k_pool_hosts(f[2]), h) end
    redis.call('SREM', k_hosts(), h)
    redis.call('DEL', k_host(h))
    table.insert(out, h)
  end
end
return out
