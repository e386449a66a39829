-- ARGV: prefix, host_id, now_ms, lease_ttl_ms, telemetry_json, n, then n x (session_id, state, last_input_ms|'')
-- One step per heartbeat: the lease first (its TTL runs from the heartbeat's arrival), the
-- telemetry stored as sent (the host record is not re-read), then the reported sessions against
-- the host's: transitions and input applied, deadlines moved, sessions the node does not know
-- returned to stop, sessions still starting returned to (re)send, and sessions the node dropped
-- ended node_ended.  A session is only ended for its absence when its last reported transition
-- is older than the previous heartbeat's arrival: the node builds each heartbeat after the
-- previous reply, so an older heartbeat (built before the node reported the session running)
-- never ends it.
-- Returns {status, host state, n_stop, stop ids..., n_ended, ended ids..., n_start, start records (6 fields each: id, user, pool, kind, gpu, profile)...};
-- status ok | unknown (the node must re-register) | retired (removed: the node must stop).
local h, now, ttl, telemetry, n = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
if redis.call('EXISTS', k_retired(h)) == 1 then return {'retired'} end
local key = k_host(h)
local f = redis.call('HMGET', key, 'state', 'pool', 'heartbeat_ms')
if f[1] == false or f[1] == 'down' then return {'unknown'} end
redis.call('SET', k_lease(h), now, 'PX', ttl)
redis.call('ZADD', k_due_leases(), now + ttl, h)
local prev = num(f[3])
redis.call('HSET', key, 'heartbeat_ms', now, 'telemetry', telemetry)

local pool = f[2]
local mine = {}
for _, sid in ipairs(redis.call('SMEMBERS', k_host_sessions(h))) do mine[sid] = true end
local t = nil
if n > 0 then t = read_timeouts(pool or '') end
local stop, ended, start = {}, {}, {}
local reported = {}
for i = 0, n - 1 do
  local sid, st, input = ARGV[7 + 3 * i], ARGV[8 + 3 * i], ARGV[9 + 3 * i]
  reported[sid] = true
  local s = nil
  if mine[sid] then s = read_clock(sid) end
  if s == nil or s.state == 'ended' then
    table.insert(stop, sid)  -- the broker ended it (or never had it here): the node must stop it
  elseif s.state == 'staged' then
    staged_ready(sid, s.pool, now)
  else
    local changed = false
    if (st == 'running' or st == 'disconnected') and st ~= s.state then
      changed = apply_state(sid, s, st, now) == 'ok'
    end
    if input ~= '' and s.state ~= 'queued' then
      local at = math.min(tonumber(input), now)
      if at > s.active then
        redis.call('HSET', k_session(sid), 'last_active_ms', at)
        s.active = at
        changed = changed or t.idle > 0  -- input only moves the idle deadline
      end
    end
    if changed then schedule_with(sid, s, t) end
  end
end
for sid, _ in pairs(mine) do
  if not reported[sid] then
    local r = redis.call('HMGET', k_session(sid), 'state', 'state_ms', 'user', 'pool', 'kind', 'gpu', 'profile')
    if r[1] == 'starting' or (r[1] == 'staged' and num(r[2]) == 0) then
      table.insert(start, {sid, r[3] or '', r[4] or '', r[5] or '', r[6] or '', r[7] or ''})
    elseif r[1] == 'staged' and num(r[2]) < prev then
      end_session(sid, 'node_ended', now)  -- was ready, the node no longer runs it: dropped (restaged below)
    elseif (r[1] == 'running' or r[1] == 'disconnected') and num(r[2]) < prev then
      if end_session(sid, 'node_ended', now) ~= nil then table.insert(ended, sid) end
    end
  end
end
if #ended > 0 and pool then pump(pool, now) end
if pool and (num(redis.call('HGET', k_pool(pool), 'staged')) > 0 or redis.call('EXISTS', k_staged(pool)) == 1) then
  restage(pool, now)  -- a staged session that could not be placed before (no seat, a queue) is retried
end
local out = {'ok', f[1], #stop}  -- f[1]: up or draining (this step never changes it)
for _, sid in ipairs(stop) do table.insert(out, sid) end
table.insert(out, #ended)
for _, sid in ipairs(ended) do table.insert(out, sid) end
table.insert(out, #start)
for _, rec in ipairs(start) do for _, v in ipairs(rec) do table.insert(out, v) end end
return out
