-- The first step of every reaper pass. ARGV: prefix, now_ms, gap_ms, lease_ttl_ms
-- Stamps P:reaper:pass with Redis's own clock (TIME: the same clock the lease keys' TTLs run on,
-- and one that broker replicas with skewed clocks share).  When the previous stamp is more than
-- gap_ms old, no replica reached Redis for that long (Redis was down, frozen or restarting, or
-- every broker was): the nodes could not renew their leases either, so every host whose lease was
-- still alive before the gap (due at or after now_ms - gap, on the brokers' clock that
-- P:due:leases uses) gets a full lease from now, in this step, before any lease is expired.  A
-- host already past its lease before the gap gets none (it was dying anyway).  Writes O(hosts)
-- once per outage, never on a pass on time.  Returns {gap_ms or -1 (no grace), hosts granted}.
if redis.replicate_commands then pcall(redis.replicate_commands) end  -- Redis 6.x: TIME before writes
local now, gap, ttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local rnow = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key = k_reaper_pass()
local last = tonumber(redis.call('GET', key) or '')
redis.call('SET', key, rnow, 'EX', REAPER_PASS_TTL_S)
if last == nil or rnow - last <= gap then return {-1, 0} end
local n = 0
for _, h in ipairs(redis.call('ZRANGEBYSCORE', k_due_leases(), now - (rnow - last), now + ttl)) do
  local st = redis.call('HGET', k_host(h), 'state')
  if st == 'up' or st == 'draining' then
    if redis.call('PTTL', k_lease(h)) < ttl then redis.call('SET', k_lease(h), now, 'PX', ttl) end
    redis.call('ZADD', k_due_leases(), now + ttl, h)
    n = n + 1
  end
end
return {rnow - last, n}
