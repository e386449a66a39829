-- The reaper's lease pass. ARGV: prefix, now_ms, limit, down_ttl_s
-- Takes up to ``limit`` hosts whose lease is due by P:due:leases (ZRANGEBYSCORE) and marks down,
-- in this step, each whose lease key is gone (its TTL, on Redis's clock, is the lease itself), so
-- each expiry happens once whichever replica runs it.  A host whose lease still lives (renewed
-- meanwhile, or a broker clock ahead of Redis's) gets its index entry moved to when it runs out.
-- Returns {n_hosts, then per host: host_id, n_ended, ended ids...}.
local now, limit, down_ttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local due = redis.call('ZRANGEBYSCORE', k_due_leases(), '-inf', now, 'LIMIT', 0, limit)
local out = {0}
for _, h in ipairs(due) do
  local state = redis.call('HGET', k_host(h), 'state')
  local left = redis.call('PTTL', k_lease(h))
  if state == false or state == 'down' then
    redis.call('ZREM', k_due_leases(), h)
  elseif left > 0 then
    redis.call('ZADD', k_due_leases(), now + left, h)
  else
    local lost = mark_down(h, now, down_ttl)
    out[1] = out[1] + 1
    table.insert(out, h)
    table.insert(out, #lost)
    for _, sid in ipairs(lost) do table.insert(out, sid) end
  end
end
return out
