-- Shared helpers prepended to every broker script (Redis 6.2+ has no FUNCTION
-- libraries, so scripts are concatenated in Python, after a few constants that
-- broker/store/live.py writes from their Python homes).  ARGV[1] is the key
-- prefix; key names mirror broker/store/keys.py.  Scripts are atomic: either
-- every write below happens or none does (no error is raised after a write).
--
-- Indexes kept by these steps (so no step, and no reaper pass, walks the fleet):
--   P:pool:{pool}:avail  zset  up hosts with a free seat, scored for the pool's strategy
--   P:pool:{pool}:avail:c / :avail:s  zsets  while the pool has a rollout (P:pool:{pool}:rollout):
--                        the avail index split into candidate-version hosts and the rest (same scores)
--   P:pool:{pool}:stats  hash  counters: hosts by state, seats total/free/used, sessions by state
--   P:due:leases         zset  host -> lease due (ms)
--   P:due:sessions       zset  live session -> when the timeout policy could end it (ms)
--   P:due:warn           zset  seated session not yet warned -> when max-duration ends it (ms)
--   P:due:purge          zset  down host -> when its record is dropped (ms)
-- A host's hash holds what it last contributed (acct = state, seats, used, free), so a
-- change moves exactly that contribution: refresh_host is the one place that does it.
local P = ARGV[1]
local function k_pools() return P .. ':pools' end
local function k_pool(n) return P .. ':pool:' .. n end
local function k_pool_hosts(n) return P .. ':pool:' .. n .. ':hosts' end
local function k_queue(n) return P .. ':pool:' .. n .. ':queue' end
local function k_avail(n) return P .. ':pool:' .. n .. ':avail' end
-- canary rollout (broker/rollout): the policy's Redis half and the avail index split by version class
local function k_rollout(n) return P .. ':pool:' .. n .. ':rollout' end
local function k_avail_class(n, c) return P .. ':pool:' .. n .. ':avail:' .. c end
local function k_stats(n) return P .. ':pool:' .. n .. ':stats' end
local function k_waits(n) return P .. ':pool:' .. n .. ':waits' end
-- staged sessions (warm, not yet any user's): id -> 0 once its node reported it ready, 1 while starting
local function k_staged(n) return P .. ':pool:' .. n .. ':staged' end
local function k_hosts() return P .. ':hosts' end
local function k_host(h) return P .. ':host:' .. h end
local function k_lease(h) return P .. ':host:' .. h .. ':lease' end
local function k_host_sessions(h) return P .. ':host:' .. h .. ':sessions' end
local function k_retired(h) return P .. ':host:' .. h .. ':retired' end
local function k_session(s) return P .. ':session:' .. s end
local function k_user(u, pool) return P .. ':user:' .. u .. ':pool:' .. pool end
local function k_live() return P .. ':live' end
local function k_outbox() return P .. ':outbox' end
local function k_due_leases() return P .. ':due:leases' end
local function k_due_sessions() return P .. ':due:sessions' end
local function k_due_warn() return P .. ':due:warn' end
local function k_due_purge() return P .. ':due:purge' end
local function k_reaper_pass() return P .. ':reaper:pass' end
local function c_session(s) return P .. ':ev:session:' .. s end
local function c_pool(n) return P .. ':ev:pool:' .. n end
local function c_node(h) return P .. ':node:' .. h end

local SCORE_BASE = 1048576  -- 2^20: more than any host's free seats, so used and free share one score

local function hgetall(key)
  local flat = redis.call('HGETALL', key)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

local function num(v)
  if v == false or v == nil or v == '' then return 0 end
  return tonumber(v) or 0
end

local function split(csv)
  local out = {}
  if csv then for i in string.gmatch(csv, '[^,]+') do table.insert(out, i) end end
  return out
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

-- Write the host's per-GPU seat counts (s:{index}) and GPU list (g) under the pool's rules.
local function set_seats(h, cfg)
  local hkey = k_host(h)
  local gpus = cjson.decode(redis.call('HGET', hkey, 'gpus') or '[]')
  local idx = {}
  for _, g in ipairs(gpus) do
    redis.call('HSET', hkey, 's:' .. g['index'], gpu_seats(g, cfg))
    table.insert(idx, tostring(g['index']))
  end
  redis.call('HSET', hkey, 'g', table.concat(idx, ','))
end

-- Placement order (mirrors broker/placement.py): breadth-first = least used, then most free,
-- then host id; depth-first = most used, then host id.  Ties on score sort by member (host id).
local function avail_score(strategy, used, free)
  if strategy == 'depth-first' then return -used end
  return used * SCORE_BASE + (SCORE_BASE - 1 - free)
end

-- Keep a host's entry in the pool's version-class indexes equal to its avail entry (``score`` nil =
-- not in avail).  Only while the pool has a rollout: then avail:c holds the hosts whose version is
-- the candidate and avail:s the others, so the two always partition avail.
local function sync_class(pool, h, version, score)
  local rv = redis.call('HGET', k_rollout(pool), 'version')
  if not rv then return end
  local cls, other = 's', 'c'
  if version == rv then cls, other = 'c', 's' end
  redis.call('ZREM', k_avail_class(pool, other), h)
  if score == nil then
    redis.call('ZREM', k_avail_class(pool, cls), h)
  else
    redis.call('ZADD', k_avail_class(pool, cls), score, h)
  end
end

-- What a host in state ``st`` adds to its pool's counters.
local function contribution(st, seats, used, free, sign, into)
  if st == false or st == nil or st == '' then return end
  into['hosts_' .. st] = (into['hosts_' .. st] or 0) + sign
  if st == 'up' then
    into['seats_total'] = (into['seats_total'] or 0) + sign * seats
    into['seats_free'] = (into['seats_free'] or 0) + sign * free
  end
  if st ~= 'down' then into['seats_used'] = (into['seats_used'] or 0) + sign * used end
end

local function apply_counts(pool, delta)
  local sk = k_stats(pool)
  for k, v in pairs(delta) do
    if v ~= 0 then redis.call('HINCRBY', sk, k, v) end
  end
end

-- Seats and used seats of each GPU of a host, read in one HMGET: two lists in the order of ``idx``.
local function gpu_seats(hkey, idx)
  local fields = {}
  for _, i in ipairs(idx) do
    table.insert(fields, 's:' .. i)
    table.insert(fields, 'u:' .. i)
  end
  local v = redis.call('HMGET', hkey, unpack(fields))
  local seats, used = {}, {}
  for j = 1, #idx do
    seats[j], used[j] = num(v[2 * j - 1]), num(v[2 * j])
  end
  return seats, used
end

-- Recount one host from its per-GPU fields and move its contribution (pool counters and
-- placement index) from what was last accounted to what is true now.
local function refresh_host(h)
  local hkey = k_host(h)
  local f = redis.call('HMGET', hkey, 'state', 'pool', 'g', 'acct', 'seats', 'used', 'free', 'version')
  local state, pool = f[1], f[2]
  if pool == false then return end
  if state == false then state = '' end
  local seats, used, free = 0, 0, 0
  local idx = split(f[3])
  if #idx > 0 then
    local gs, gu = gpu_seats(hkey, idx)
    for j = 1, #idx do
      local s, u = gs[j], gu[j]
      seats = seats + s
      used = used + u
      if s > u then free = free + s - u end
    end
  end
  local delta = {}
  contribution(f[4], num(f[5]), num(f[6]), num(f[7]), -1, delta)
  contribution(state, seats, used, free, 1, delta)
  apply_counts(pool, delta)
  redis.call('HSET', hkey, 'acct', state, 'seats', seats, 'used', used, 'free', free)
  if state == 'up' and free > 0 then
    local strategy = redis.call('HGET', k_pool(pool), 'strategy') or 'breadth-first'
    local score = avail_score(strategy, used, free)
    redis.call('ZADD', k_avail(pool), score, h)
    sync_class(pool, h, f[8], score)
  else
    redis.call('ZREM', k_avail(pool), h)
    sync_class(pool, h, f[8], nil)
  end
end

-- Take a host out of its pool's counters and index (before it is deleted or moves pools).
local function unaccount_host(h)
  local hkey = k_host(h)
  local f = redis.call('HMGET', hkey, 'pool', 'acct', 'seats', 'used', 'free')
  if f[1] == false then return end
  local delta = {}
  contribution(f[2], num(f[3]), num(f[4]), num(f[5]), -1, delta)
  apply_counts(f[1], delta)
  redis.call('HSET', hkey, 'acct', '')
  redis.call('ZREM', k_avail(f[1]), h)
  redis.call('ZREM', k_avail_class(f[1], 'c'), h)
  redis.call('ZREM', k_avail_class(f[1], 's'), h)
end

-- The GPU of a host that gets the next session: fewest used, then lowest index, with a free seat.
local function pick_gpu(h)
  local hkey = k_host(h)
  local idx = split(redis.call('HGET', hkey, 'g'))
  if #idx == 0 then return nil end
  local gs, gu = gpu_seats(hkey, idx)
  local best, best_used = nil, nil
  for j = 1, #idx do
    local s, u, i = gs[j], gu[j], tonumber(idx[j])
    if s > u and (best == nil or u < best_used or (u == best_used and i < best)) then
      best, best_used = i, u
    end
  end
  return best
end

-- Placement: the first host of an index whose lease lives.  The index holds only up hosts
-- with a free seat, so this reads O(log n) keys; a host whose lease ran out (not yet marked down
-- by the reaper) is skipped, not removed.
local function pick_in(key)
  local from = 0
  while true do
    local ids = redis.call('ZRANGE', key, from, from + 7)
    if #ids == 0 then return nil, nil end
    for _, h in ipairs(ids) do
      if redis.call('EXISTS', k_lease(h)) == 1 then
        local gpu = pick_gpu(h)
        if gpu ~= nil then return h, gpu end
      end
    end
    from = from + 8
  end
end

-- The pool's next host: from the version class ``pref`` ('c' candidate, 's' stable; nil = no
-- preference) when it has a free seat, else from the whole index.  The class indexes only order the
-- preference: a seat is taken by pick_gpu's check on the host itself, so a stale class entry can
-- never over-seat.
local function pick(pool, pref)
  if pref ~= nil then
    local h, gpu = pick_in(k_avail_class(pool, pref))
    if h ~= nil then return h, gpu end
  end
  return pick_in(k_avail(pool))
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

local function count_session(pool, from, to)
  local sk = k_stats(pool)
  if from ~= nil and from ~= false and from ~= 'ended' then redis.call('HINCRBY', sk, 's_' .. from, -1) end
  if to ~= nil and to ~= 'ended' then redis.call('HINCRBY', sk, 's_' .. to, 1) end
end

-- ---- session deadlines (mirrors broker.lifecycle.next_due_ms and max_duration_end_ms) ----------
local SESSION_CLOCK = {'state', 'pool', 'created_ms', 'seated_ms', 'last_active_ms', 'disconnected_ms',
                       'warned_ms', 'left_ms'}
local TIMEOUTS = {'queue_timeout_s', 'idle_timeout_s', 'disconnect_timeout_s', 'max_duration_s', 'close_grace_s'}

local function read_clock(sid)
  local f = redis.call('HMGET', k_session(sid), unpack(SESSION_CLOCK))
  if f[1] == false then return nil end
  return {state = f[1], pool = f[2], created = num(f[3]), seated = num(f[4]), active = num(f[5]),
          disconnected = num(f[6]), warned = num(f[7]), left = num(f[8])}
end

local function read_timeouts(pool)
  local c = redis.call('HMGET', k_pool(pool), unpack(TIMEOUTS))
  local grace = CLOSE_GRACE_DEFAULT_S  -- a pool stored before the setting existed
  if c[5] ~= false then grace = num(c[5]) end
  return {queue = num(c[1]), idle = num(c[2]), disconnect = num(c[3]), max = num(c[4]), grace = grace}
end

local function next_due(s, t)
  if s.state == 'ended' then return nil end
  if s.state == 'queued' then return s.created + t.queue * 1000 end
  local seated = s.seated
  if seated == 0 then seated = s.created end
  local due = nil
  local function m(v) if due == nil or v < due then due = v end end
  if t.max > 0 then m(seated + t.max * 1000) end
  if s.state == 'starting' then
    m(seated + START_TIMEOUT_MS)
    return due
  end
  if s.state == 'disconnected' then
    local since = s.disconnected
    if since == 0 then since = seated end
    local limit = t.disconnect
    if s.left > 0 and t.grace < limit then limit = t.grace end  -- the viewer closed its tab on purpose
    m(since + limit * 1000)
  end
  if t.idle > 0 then m(math.max(s.active, seated) + t.idle * 1000) end
  return due
end

-- Write a session's timeout deadline from its clock ``s`` (read_clock; nil = gone) under timeouts ``t``.
local function schedule_with(sid, s, t)
  local due = nil
  if s ~= nil then due = next_due(s, t) end
  if due == nil then
    redis.call('ZREM', k_due_sessions(), sid)
  else
    redis.call('ZADD', k_due_sessions(), due, sid)
  end
end

-- Write a session's max-duration warning entry: seated, a limit, not yet warned.  It only moves
-- when the session is seated, warned or ended, or the pool's limit changes.
local function schedule_warn(sid, s, t)
  if s ~= nil and s.state ~= 'queued' and s.state ~= 'ended' and t.max > 0 and s.warned == 0 then
    local seated = s.seated
    if seated == 0 then seated = s.created end
    redis.call('ZADD', k_due_warn(), seated + t.max * 1000, sid)
  else
    redis.call('ZREM', k_due_warn(), sid)
  end
end

local function schedule(sid)
  local s = read_clock(sid)
  if s == nil or s.state == 'ended' or s.state == 'staged' then  -- a staged session has no timeouts
    schedule_with(sid, nil, nil)
    schedule_warn(sid, nil, nil)
    return
  end
  local t = read_timeouts(s.pool)
  schedule_with(sid, s, t)
  schedule_warn(sid, s, t)
end

-- Count one seating in the pool's queue wait histogram (ms from the request to the seat, 0 when
-- seated at once): bucket i holds the waits over bound i-1 up to QUEUE_WAIT_BUCKETS_MS[i], bucket
-- #+1 the rest.  Kept here, in the step that seats, so every replica's /metrics reads the same counts.
local function record_wait(pool, wait_ms)
  wait_ms = math.max(math.floor(wait_ms), 0)
  local i = #QUEUE_WAIT_BUCKETS_MS + 1
  for j, le in ipairs(QUEUE_WAIT_BUCKETS_MS) do
    if wait_ms <= le then i = j break end
  end
  redis.call('HINCRBY', k_waits(pool), 'b' .. i, 1)
  redis.call('HINCRBY', k_waits(pool), 'sum_ms', wait_ms)
end

-- Seat a session on (host, gpu): all writes of one bind happen together.  ``created``: when it was
-- requested (ms), for the queue wait histogram.
local function bind(sid, pool, host, gpu, now, created)
  record_wait(pool, tonumber(now) - (tonumber(created) or tonumber(now)))
  local hkey = k_host(host)
  redis.call('HINCRBY', hkey, 'u:' .. gpu, 1)
  refresh_host(host)
  redis.call('SADD', k_host_sessions(host), sid)
  local hf = redis.call('HMGET', hkey, 'address', 'version')
  local address = hf[1] or ''
  redis.call('HSET', k_session(sid), 'state', 'starting', 'host', host, 'gpu', tostring(gpu),
             'address', address, 'host_version', hf[2] or '', 'seated_ms', now, 'last_active_ms', now)
  count_session(pool, 'queued', 'starting')
  schedule(sid)
  local s = session_view(sid)
  redis.call('RPUSH', k_outbox(), cjson.encode({kind = 'start', session = s, ts_ms = now}))
  redis.call('PUBLISH', c_node(host), cjson.encode({cmd = 'start', session = s}))
  publish_state(sid, 'starting', {host = host})
end

-- Seat queued sessions while the head of the pool's queue fits somewhere.
local function pump(pool, now)
  local seated = {}
  if redis.call('EXISTS', k_pool(pool)) == 0 then return seated end
  while true do
    local head = redis.call('LINDEX', k_queue(pool), 0)
    if not head then break end
    local f = redis.call('HMGET', k_session(head), 'state', 'created_ms')
    if f[1] ~= 'queued' then
      redis.call('LPOP', k_queue(pool))  -- stale entry (ended meanwhile): drop it
    else
      local host, gpu = pick(pool)
      if host == nil then break end
      redis.call('LPOP', k_queue(pool))
      bind(head, pool, host, gpu, now, f[2])
      table.insert(seated, head)
    end
  end
  if #seated > 0 then
    redis.call('PUBLISH', c_pool(pool), cjson.encode({type = 'queue', pool = pool}))
  end
  return seated
end

-- A node-reported transition (running | disconnected) of a seated session, with its clock ``s``
-- (read_clock, updated here).  Returns ok | illegal.  ``state_ms`` records when it happened: a
-- heartbeat that left the session out only ends it when the node built that heartbeat later.
local function apply_state(sid, s, new, now)
  local cur = s.state
  if cur == new then return 'ok' end
  local legal = (new == 'running' and (cur == 'starting' or cur == 'disconnected'))
             or (new == 'disconnected' and (cur == 'starting' or cur == 'running'))
  if not legal then return 'illegal' end
  local key = k_session(sid)
  redis.call('HSET', key, 'state', new, 'state_ms', now)
  if new == 'running' then
    if num(redis.call('HGET', key, 'started_ms')) == 0 then redis.call('HSET', key, 'started_ms', now) end
    redis.call('HSET', key, 'disconnected_ms', 0, 'last_active_ms', now, 'left_ms', 0)
    s.disconnected = 0
    s.left = 0  -- a viewer is back: a later drop gets the full disconnect timeout
    if now > s.active then s.active = now end
  else
    redis.call('HSET', key, 'disconnected_ms', now)
    s.disconnected = now
  end
  s.state = new
  count_session(s.pool, cur, new)
  publish_state(sid, new)
  return 'ok'
end

-- Drop a staged session (record ``s``): free its seat, tell its node to stop it, forget it.  It was
-- never anyone's, so nothing is recorded (no outbox record, no user or live set, no deadlines).
local function drop_staged(sid, s, reason)
  local host, pool = s['host'], s['pool']
  if host ~= nil and host ~= '' then
    if redis.call('SREM', k_host_sessions(host), sid) == 1 then
      local left = redis.call('HINCRBY', k_host(host), 'u:' .. s['gpu'], -1)
      if left < 0 then redis.call('HSET', k_host(host), 'u:' .. s['gpu'], 0) end
      refresh_host(host)
    end
    redis.call('PUBLISH', c_node(host), cjson.encode({cmd = 'stop', session_id = sid, reason = reason}))
  end
  if pool ~= nil then redis.call('ZREM', k_staged(pool), sid) end
  redis.call('DEL', k_session(sid))
end

-- End one session: free its seat or queue slot, record it, tell its node.
-- Returns the pool when something changed, nil when the session was not live; a staged session is
-- dropped (status ``dropped``: it ends as if it never existed).
local function end_session(sid, reason, now)
  local key = k_session(sid)
  local s = hgetall(key)
  if s['state'] == nil then return nil, 'not_found' end
  if s['state'] == 'ended' then return nil, 'already_ended' end
  if s['state'] == 'staged' then
    drop_staged(sid, s, reason)
    return s['pool'], 'dropped'
  end
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
      refresh_host(host)
    end
    redis.call('PUBLISH', c_node(host), cjson.encode({cmd = 'stop', session_id = sid, reason = reason}))
  end
  count_session(pool, s['state'], 'ended')
  redis.call('HSET', key, 'state', 'ended', 'ended_ms', now, 'end_reason', reason)
  redis.call('EXPIRE', key, ENDED_TTL_S)
  redis.call('ZREM', k_due_sessions(), sid)
  redis.call('ZREM', k_due_warn(), sid)
  redis.call('SREM', k_user(s['user'], pool), sid)
  redis.call('SREM', k_live(), sid)
  redis.call('RPUSH', k_outbox(), cjson.encode({kind = 'end', session = session_view(sid), ts_ms = now}))
  publish_state(sid, 'ended', {reason = reason})
  return pool, 'ended'
end

-- A host whose lease ran out goes down: its sessions end host_lost, its seats are freed, it
-- leaves the pool's host set and index, and its record is dropped ``down_ttl_s`` later.
local function mark_down(h, now, down_ttl_s)
  local key = k_host(h)
  local out = {}
  for _, sid in ipairs(redis.call('SMEMBERS', k_host_sessions(h))) do
    local _, st = end_session(sid, 'host_lost', now)
    if st ~= 'dropped' then table.insert(out, sid) end  -- a staged session was nobody's
  end
  redis.call('DEL', k_host_sessions(h), k_lease(h))
  for _, i in ipairs(split(redis.call('HGET', key, 'g'))) do redis.call('HSET', key, 'u:' .. i, 0) end
  redis.call('HSET', key, 'state', 'down', 'down_ms', now)
  refresh_host(h)  -- counted as down in its pool until the record is dropped
  local pool = redis.call('HGET', key, 'pool')
  if pool then redis.call('SREM', k_pool_hosts(pool), h) end
  -- Redis drops the record by itself an hour after the reaper would (the reaper keeps counters right)
  redis.call('EXPIRE', key, 2 * down_ttl_s)
  redis.call('ZREM', k_due_leases(), h)
  redis.call('ZADD', k_due_purge(), now + down_ttl_s * 1000, h)
  return out
end

-- ---- staged sessions (a pool's ``staged`` setting) -----------------------------------------------
-- A staged session is a seat like any other (u:{gpu}, the host's session set, so placement, counters
-- and the autoscaler see it) whose record has state 'staged' and no user: its node starts display,
-- app and encoder at once.  It is in no user set, not in P:live, has no deadlines and writes nothing
-- to the outbox, so it never reaches anyone's session list or history until create_session hands
-- it to a user (then it becomes that user's session, same id, with a start record).

-- The profile a pool's staged sessions run (the web client's: 30 fps desktops, 60 fps games).
local function staged_profile(cfg)
  local fps = 30
  if cfg['kind'] == 'game' then fps = 60 end
  return {width = 1280, height = 720, fps = fps, codec = 'auto'}
end

-- The node reported staged session ``sid`` ready (running, or listed in a heartbeat).
local function staged_ready(sid, pool, now)
  if redis.call('ZADD', k_staged(pool), 'XX', 'CH', 0, sid) == 1 then
    redis.call('HSET', k_session(sid), 'state_ms', now)
  end
end

-- Keep the pool's staged sessions at its ``staged`` setting: drop the extra (still starting first,
-- then the newest ids), and stage new ones on free seats while nobody queues (a queued user comes
-- first).  Returns the ids staged.
local function restage(pool, now)
  local cfg = pool_cfg(pool)
  if cfg == nil then return {} end
  local want = num(cfg['staged'])
  local key = k_staged(pool)
  local have = redis.call('ZCARD', key)
  while have > want do
    local sid = redis.call('ZRANGE', key, -1, -1)[1]
    local s = hgetall(k_session(sid))
    if s['state'] == 'staged' then drop_staged(sid, s, 'unstaged') else redis.call('ZREM', key, sid) end
    have = have - 1
  end
  local out = {}
  if have >= want or redis.call('LLEN', k_queue(pool)) > 0 then return out end
  local profile = cjson.encode(staged_profile(cfg))
  while have < want do
    local host, gpu = pick(pool)
    if host == nil then break end
    local sid = string.sub(redis.sha1hex(P .. ':staged:' .. redis.call('INCR', P .. ':staged:seq') .. ':' .. now
                                         .. ':' .. host), 1, 32)
    local hkey = k_host(host)
    redis.call('HINCRBY', hkey, 'u:' .. gpu, 1)
    refresh_host(host)
    redis.call('SADD', k_host_sessions(host), sid)
    local hf = redis.call('HMGET', hkey, 'address', 'version')
    redis.call('HSET', k_session(sid), 'user', '', 'pool', pool, 'kind', cfg['kind'], 'profile', profile,
               'state', 'staged', 'created_ms', now, 'host', host, 'gpu', tostring(gpu), 'address', hf[1] or '',
               'host_version', hf[2] or '', 'seated_ms', now, 'started_ms', 0, 'last_active_ms', now,
               'disconnected_ms', 0, 'ended_ms', 0, 'end_reason', '', 'state_ms', 0)
    redis.call('ZADD', key, 1, sid)
    redis.call('PUBLISH', c_node(host), cjson.encode({cmd = 'start', session = session_view(sid)}))
    have = have + 1
    table.insert(out, sid)
  end
  return out
end

-- A staged session of ``pool`` for a user asking for ``profile`` (decoded): ready ones first, on a
-- host that is up with a live lease; the size may differ where the desktop can be resized (the
-- client sends its size once the first frame shows).  Returns the id or nil.
local function pick_staged(pool, cfg, profile)
  local want = staged_profile(cfg)
  if (profile['fps'] or want.fps) ~= want.fps or (profile['codec'] or 'auto') ~= want.codec then return nil end
  local resizable = cfg['kind'] ~= 'game' and cfg['allow_resize'] == 'true'
  if not resizable and ((profile['width'] or want.width) ~= want.width
                        or (profile['height'] or want.height) ~= want.height) then
    return nil
  end
  for _, sid in ipairs(redis.call('ZRANGE', k_staged(pool), 0, -1)) do
    local f = redis.call('HMGET', k_session(sid), 'state', 'host')
    if f[1] == 'staged' and redis.call('HGET', k_host(f[2]), 'state') == 'up'
        and redis.call('EXISTS', k_lease(f[2])) == 1 then
      return sid
    end
  end
  return nil
end

-- Hand staged session ``sid`` to ``user``: it becomes the user's seated session (running when its
-- node reported it ready, else starting), recorded and scheduled like a seating; the node is told to
-- bind it (same id: display, app and encoder keep running).
local function hand_out(sid, user, pool, now)
  local key = k_session(sid)
  local ready = redis.call('ZSCORE', k_staged(pool), sid) == '0'
  redis.call('ZREM', k_staged(pool), sid)
  local state = 'starting'
  if ready then state = 'running' end
  redis.call('HSET', key, 'user', user, 'state', state, 'created_ms', now, 'seated_ms', now, 'last_active_ms', now,
             'state_ms', now, 'started_ms', ready and now or 0)
  redis.call('SADD', k_user(user, pool), sid)
  redis.call('SADD', k_live(), sid)
  count_session(pool, nil, state)
  record_wait(pool, 0)
  schedule(sid)
  local s = session_view(sid)
  redis.call('RPUSH', k_outbox(), cjson.encode({kind = 'start', session = s, ts_ms = now}))
  redis.call('PUBLISH', c_node(s['host']), cjson.encode({cmd = 'start', session = s, bind = true}))
  publish_state(sid, state, {host = s['host']})
end
