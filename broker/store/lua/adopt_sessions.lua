-- Re-adopt sessions a re-registering node still streams (the broker lost its live state).
-- ARGV: prefix, host_id, now_ms, n, then n x (session_id, user, pool, kind, gpu, profile_json, state,
-- created_ms, seated_ms, started_ms).  Runs right after register_host, in the host's pool.
-- Per session: a record that exists is kept when it is live on this host, else stopped (another
-- host has it, or it ended).  A missing record is rebuilt on this host and GPU as the node
-- reports it (running | disconnected), when the claim is in the host's pool and the GPU has a free
-- seat, with the same writes as a seating (seat, host set, user set, live set, counters,
-- deadlines) and a start record for the outbox (SQL skips the duplicate); anything else is
-- stopped.  Returns {session_id, adopted | kept | stop, ...}.
local h, now, n = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local hkey = k_host(h)
local f = redis.call('HMGET', hkey, 'state', 'pool', 'address')
local out = {}
for i = 0, n - 1 do
  local b = 5 + 10 * i
  local sid, user, pool, kind, gpu, profile, st = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4],
    ARGV[b + 5], ARGV[b + 6]
  local created, seated, started = num(ARGV[b + 7]), num(ARGV[b + 8]), num(ARGV[b + 9])
  local skey = k_session(sid)
  local cur = redis.call('HMGET', skey, 'state', 'host')
  local status = 'stop'
  if cur[1] ~= false then
    if cur[1] ~= 'ended' and cur[2] == h then status = 'kept' end
  elseif (f[1] == 'up' or f[1] == 'draining') and f[2] == pool and (st == 'running' or st == 'disconnected')
      and num(redis.call('HGET', hkey, 's:' .. gpu)) > num(redis.call('HGET', hkey, 'u:' .. gpu)) then
    if created == 0 then created = now end
    if seated == 0 then seated = now end
    local disconnected = 0
    if st == 'disconnected' then disconnected = now end
    redis.call('HINCRBY', hkey, 'u:' .. gpu, 1)
    refresh_host(h)
    redis.call('SADD', k_host_sessions(h), sid)
    redis.call('HSET', skey, 'user', user, 'pool', pool, 'kind', kind, 'profile', profile, 'state', st,
               'created_ms', created, 'host', h, 'gpu', gpu, 'address', f[3] or '', 'seated_ms', seated,
               'started_ms', started, 'last_active_ms', now, 'disconnected_ms', disconnected, 'ended_ms', 0,
               'end_reason', '', 'state_ms', now, 'adopted_ms', now)
    redis.call('SADD', k_user(user, pool), sid)
    redis.call('SADD', k_live(), sid)
    count_session(pool, nil, st)
    schedule(sid)
    redis.call('RPUSH', k_outbox(), cjson.encode({kind = 'start', session = session_view(sid), ts_ms = now}))
    publish_state(sid, st, {host = h})
    status = 'adopted'
  end
  table.insert(out, sid)
  table.insert(out, status)
end
return out
