-- The reaper's timeout pass. ARGV: prefix, now_ms, limit, claim_ms
-- Claims up to ``limit`` sessions whose deadline is due by moving their score ``claim_ms`` ahead,
-- so another replica's pass does not take them too; the claimer ends each one (end_session drops
-- its deadline) or re-schedules it (reschedule.lua).  A claimer that dies leaves its claims to
-- come due again after ``claim_ms``.  Returns the claimed ids.
local now, limit, claim = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local ids = redis.call('ZRANGEBYSCORE', k_due_sessions(), '-inf', now, 'LIMIT', 0, limit)
for _, sid in ipairs(ids) do redis.call('ZADD', k_due_sessions(), now + claim, sid) end
return ids
