-- ARGV: prefix, session_id, user, pool, profile_json, now_ms
-- Returns {status, session_id, queue_position or '', session hash fields...} with status one of
-- seated | queued | existing | unknown_pool | queue_full (the hash saves the caller a round trip).
-- seated may name another id than ARGV's: a staged session handed to the user (same record, now theirs).
local sid, user, pool, profile, now = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local cfg = pool_cfg(pool)
if cfg == nil then return {'unknown_pool', ''} end

-- Per-user limit, and reconnect: a user at the limit gets their oldest live session back.
local ukey = k_user(user, pool)
local live = {}
for _, other in ipairs(redis.call('SMEMBERS', ukey)) do
  local f = redis.call('HMGET', k_session(other), 'state', 'created_ms')
  if f[1] == false or f[1] == 'ended' then
    redis.call('SREM', ukey, other)
  else
    table.insert(live, {id = other, created = tonumber(f[2])})
  end
end
if #live >= tonumber(cfg['max_sessions_per_user']) then
  table.sort(live, function(a, b) return a.created < b.created or (a.created == b.created and a.id < b.id) end)
  local out = {'existing', live[1].id, redis.call('LPOS', k_queue(pool), live[1].id) or ''}
  for _, v in ipairs(redis.call('HGETALL', k_session(live[1].id))) do table.insert(out, v) end
  return out
end

-- Canary rollout: the pool's seating counter n says which version class this seating prefers, so
-- exactly floor(n * share / 100) of the first n seatings prefer the candidate (broker.rollout.policy.
-- prefers_candidate is the same rule); a class without a free seat falls back to the whole index.
local function rollout_pref(p)
  local r = redis.call('HMGET', k_rollout(p), 'version', 'share_pct')
  if not r[1] then return nil end
  local share = tonumber(r[2]) or 0
  local n = redis.call('HINCRBY', k_rollout(p), 'n', 1)
  if math.floor(n * share / 100) > math.floor((n - 1) * share / 100) then return 'c' end
  return 's'
end

local qkey = k_queue(pool)
local qlen = redis.call('LLEN', qkey)
-- The pool's staged sessions (its ``staged`` setting): one that fits is handed out, then refilled.
local has_staged = redis.call('EXISTS', k_staged(pool)) == 1
if qlen == 0 and has_staged then
  local staged = pick_staged(pool, cfg, cjson.decode(profile))
  if staged ~= nil then
    hand_out(staged, user, pool, now)
    restage(pool, now)
    local out = {'seated', staged, ''}
    for _, v in ipairs(redis.call('HGETALL', k_session(staged))) do table.insert(out, v) end
    return out
  end
end
local host, gpu = nil, nil
if qlen == 0 then host, gpu = pick(pool, rollout_pref(pool)) end  -- FIFO: nobody jumps a non-empty queue
if host == nil and qlen == 0 and has_staged then
  -- full, and no staged session fits this user: a staged seat yields to the user (no refill while full)
  local victim = redis.call('ZRANGE', k_staged(pool), -1, -1)[1]
  if victim then
    drop_staged(victim, hgetall(k_session(victim)), 'yielded')
    host, gpu = pick(pool)
  end
end
if host == nil and qlen >= tonumber(cfg['max_queue']) then return {'queue_full', ''} end

redis.call('HSET', k_session(sid), 'user', user, 'pool', pool, 'kind', cfg['kind'], 'profile', profile,
           'state', 'queued', 'created_ms', now, 'host', '', 'gpu', '', 'seated_ms', 0, 'started_ms', 0,
           'last_active_ms', now, 'disconnected_ms', 0, 'ended_ms', 0, 'end_reason', '')
redis.call('SADD', ukey, sid)
redis.call('SADD', k_live(), sid)
count_session(pool, nil, 'queued')
local out
if host ~= nil then
  bind(sid, pool, host, gpu, now, now)
  out = {'seated', sid, ''}
else
  local pos = redis.call('RPUSH', qkey, sid)
  schedule(sid)
  -- SQL learns of the queued session (live_sessions), so a Redis that loses it cannot lose it silently
  redis.call('RPUSH', k_outbox(), cjson.encode({kind = 'queued', session = session_view(sid), ts_ms = now}))
  publish_state(sid, 'queued', {queue_position = pos})
  out = {'queued', sid, pos}
end
for _, v in ipairs(redis.call('HGETALL', k_session(sid))) do table.insert(out, v) end
return out
