-- Shared helpers prepended to every broker script (Redis 6.2+ has no FUNCTION
-- libraries, so scripts are concatenated in Python).  ARGV[1] is the key
-- prefix; key names mirror broker/store/keys.py.  Scripts are atomic: either
-- every write below happens or none does (no error is raised after a write).
local P = ARGV[1]
local function k_pools() return P .. ':pools' end
local function k_pool(n) return P .. ':pool:' .. n end
local function k_pool_hosts(n) return P .. ':pool:' .. n .. ':hosts' end
local function k_queue(n) return P .. ':pool:' .. n .. ':queue' end
local function k_hosts() return P .. ':hosts' end
local function k_host(h) return P .. ':host:' .. h end
local function k_lease(h) return P .. ':host:' .. h .. ':lease' end
local function k_host_sessions(h) return P .. ':host:' .. h .. ':sessions' end
local function k_retired(h) return P .. ':host:' .. h .. ':retired' end
local function k_session(s) return P .. ':session:' .. s end
local function k_user(u, pool) return P .. ':user:' .. u .. ':pool:' .. pool end
local function k_live() return P .. ':live' end
local function k_outbox() return P .. ':outbox' end
local function c_session(s) return P .. ':ev:session:' .. s end
local function c_pool(n) return P .. ':ev:pool:' .. n end
local function c_node(h) return P .. ':node:' .. h end

local ENDED_TTL_S = 3600

local function hgetall(key)
  local flat = redis.call('HGETALL', key)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

local function pool_cfg(pool)
  local c = hgetall(k_pool(pool))
  if c['strategy'] == nil then return nil end
  return c
end

-- Seats of one GPU: min(max per GPU, encoder limit, VRAM budget / per-session VRAM).
local function gpu_seats(g, cfg)
  local by_vram = math.floor(tonumber(g['vram_mb']) * (1.0 - tonumber(cfg['vram_headroom']))
                             / tonumber(cfg['vram_per_session_mb']) + 1e-9)
  local n = math.min(tonumber(cfg['max_sessions_per_gpu']), by_vram)
  if g['encoder_session_limit'] ~= nil and g['encoder_session_limit'] ~= cjson.null then
    n = math.min(n, tonumber(g['encoder_session_limit']))
  end
  if n < 0 then n = 0 end
  return n
end

-- The host's GPUs with seats and used counts; nil when the host cannot take sessions.
local function host_load(h, cfg, need_up)
  local key = k_host(h)
  local f = redis.call('HMGET', key, 'state', 'gpus')
  if f[1] == false or f[2] == false then return nil end
  if need_up and (f[1] ~= 'up' or redis.call('EXISTS', k_lease(h)) == 0) then return nil end
  local gpus = cjson.decode(f[2])
  local load = {id = h, used = 0, free = 0, seats = 0, gpus = {}}
  for _, g in ipairs(gpus) do
    local used = tonumber(redis.call('HGET', key, 'u:' .. g['index']) or '0')
    local seats = gpu_seats(g, cfg)
    local free = seats - used
    if free < 0 then free = 0 end
    table.insert(load.gpus, {index = g['index'], seats = seats, used = used, free = free})
    load.used = load.used + used
    load.free = load.free + free
    load.seats = load.seats + seats
  end
  return load
end

-- Placement (mirrors broker/placement.py): breadth-first = least used, then most free,
-- then host id; depth-first = most used, then host id.  GPU = fewest used, lowest index.
local function pick(pool, cfg)
  local best = nil
  local depth = cfg['strategy'] == 'depth-first'
  for _, h in ipairs(redis.call('SMEMBERS', k_pool_hosts(pool))) do
    local l = host_load(h, cfg, true)
    if l ~= nil and l.free > 0 then
      local better = false
      if best == nil then better = true
      elseif depth then
        better = l.used > best.used or (l.used == best.used and l.id < best.id)
      else
        better = l.used < best.used or (l.used == best.used and
                 (l.free > best.free or (l.free == best.free and l.id < best.id)))
      end
      if better then best = l end
    end
  end
  if best == nil then return nil, nil end
  local gb = nil
  for _, g in ipairs(best.gpus) do
    if g.free > 0 and (gb == nil or g.used < gb.used or (g.used == gb.used and g.index < gb.index)) then
      gb = g
    end
  end
  return best.id, gb.index
end

local function publish_state(sid, state, extra)
  local msg = {type = 'state', session_id = sid, state = state}
  if extra ~= nil then for k, v in pairs(extra) do msg[k] = v end end
  redis.call('PUBLISH', c_session(sid), cjson.encode(msg))
end

local function session_view(sid)
  local s = hgetall(k_session(sid))
  s['id'] = sid
  return s
end

-- Seat a session on (host, gpu): all writes of one bind happen together.
local function bind(sid, pool, host, gpu, now)
  local hkey = k_host(host)
  redis.call('HINCRBY', hkey, 'u:' .. gpu, 1)
  redis.call('SADD', k_host_sessions(host), sid)
  local address = redis.call('HGET', hkey, 'address') or ''
  redis.call('HSET', k_session(sid), 'state', 'starting', 'host', host, 'gpu', tostring(gpu),
             'address', address, 'seated_ms', now, 'last_active_ms', now)
  local s = session_view(sid)
  redis.call('RPUSH', k_outbox(), cjson.encode({kind = 'start', session = s, ts_ms = now}))
  redis.call('PUBLISH', c_node(host), cjson.encode({cmd = 'start', session = s}))
  publish_state(sid, 'starting', {host = host})
end

-- Seat queued sessions while the head of the pool's queue fits somewhere.
local function pump(pool, now)
  local cfg = pool_cfg(pool)
  local seated = {}
  if cfg == nil then return seated end
  while true do
    local head = redis.call('LINDEX', k_queue(pool), 0)
    if not head then break end
    local st = redis.call('HGET', k_session(head), 'state')
    if st ~= 'queued' then
      redis.call('LPOP', k_queue(pool))  -- stale entry (ended meanwhile): drop it
    else
      local host, gpu = pick(pool, cfg)
      if host == nil then break end
      redis.call('LPOP', k_queue(pool))
      bind(head, pool, host, gpu, now)
      table.insert(seated, head)
    end
  end
  if #seated > 0 then
    redis.call('PUBLISH', c_pool(pool), cjson.encode({type = 'queue', pool = pool}))
  end
  return seated
end

-- End one session: free its seat or queue slot, record it, tell its node.
-- Returns the pool when something changed, nil when the session was not live.
local function end_session(sid, reason, now)
  local key = k_session(sid)
  local s = hgetall(key)
  if s['state'] == nil then return nil, 'not_found' end
  if s['state'] == 'ended' then return nil, 'already_ended' end
  local pool = s['pool']
  if s['state'] == 'queued' then
    redis.call('LREM', k_queue(pool), 0, sid)
    redis.call('PUBLISH', c_pool(pool), cjson.encode({type = 'queue', pool = pool}))
  else
    local host = s['host']
    local hkey = k_host(host)
    if redis.call('SREM', k_host_sessions(host), sid) == 1 then
      local left = redis.call('HINCRBY', hkey, 'u:' .. s['gpu'], -1)
      if left < 0 then redis.call('HSET', hkey, 'u:' .. s['gpu'], 0) end
    end
    redis.call('PUBLISH', c_node(host), cjson.encode({cmd = 'stop', session_id = sid, reason = reason}))
  end
  redis.call('HSET', key, 'state', 'ended', 'ended_ms', now, 'end_reason', reason)
  redis.call('EXPIRE', key, ENDED_TTL_S)
  redis.call('SREM', k_user(s['user'], pool), sid)
  redis.call('SREM', k_live(), sid)
  redis.call('RPUSH', k_outbox(), cjson.encode({kind = 'end', session = session_view(sid), ts_ms = now}))
  publish_state(sid, 'ended', {reason = reason})
  return pool, 'ended'
end
