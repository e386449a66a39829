-- A session's share links and the viewers watching through them, one atomic step per operation.
-- ARGV: prefix, op, session_id, then per op:
--   "create" share_id record_json ttl_ms now_ms max -> "ok" | "not_live" | "too_many"
--            (prunes links whose record says they expired; the hash lives as long as its latest link)
--   "revoke" share_id ("" = every link) now_ms -> {status, {revoked share ids}, {viewer members removed}}
--            status "ok" or "not_found" (a named link that is neither live nor already revoked).  Each
--            revoked link gets P:share:{id}:revoked for the rest of its token's life, its viewers leave
--            P:session:{id}:viewers, and the step publishes {"type":"share_revoked","shares":[...]} on
--            P:sig:{session}:shares, so a viewer joining concurrently either sees the marker or is listed.
--   "join"   share_id viewer_id hold_ms now_ms -> "ok" | "revoked" | "not_seated"
--   "keep"   share_id viewer_id hold_ms now_ms -> 1 renewed | 0 gone (revoked, or the hold lapsed)
--   "leave"  share_id viewer_id -> 1 | 0 (a viewer in control leaves it: P:session:{id}:control is dropped)
--   "control" viewer_id ("" = take control back) hold_ms now_ms -> {status, previous "<share> <viewer>" or ""}
--            status "ok", or "not_viewer" when viewer_id holds no live place among the session's viewers.
--            P:session:{id}:control holds the one viewer in control, for hold_ms at most; revoking its link
--            or its leaving drops it, so control never outlives the viewer's place.
-- Times are wall-clock ms from the caller (token expiries are wall-clock epoch seconds).
local op, sid = ARGV[2], ARGV[3]
local k_shares = k_session(sid) .. ':shares'
local k_viewers = k_session(sid) .. ':viewers'
local function k_revoked(id) return P .. ':share:' .. id .. ':revoked' end
local k_control = k_session(sid) .. ':control'
local SEATED = {starting = true, running = true, disconnected = true}

if op == 'create' then
  local id, record, ttl, now, max = ARGV[4], ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
  local state = redis.call('HGET', k_session(sid), 'state')
  if not state or state == 'ended' then return 'not_live' end
  local flat = redis.call('HGETALL', k_shares)
  local live = 0
  for i = 1, #flat, 2 do
    local ok, rec = pcall(cjson.decode, flat[i + 1])
    if ok and type(rec) == 'table' and tonumber(rec.expires_at) and tonumber(rec.expires_at) * 1000 > now then
      live = live + 1
    else
      redis.call('HDEL', k_shares, flat[i])
    end
  end
  if live >= max then return 'too_many' end
  redis.call('HSET', k_shares, id, record)
  if redis.call('PTTL', k_shares) < ttl then redis.call('PEXPIRE', k_shares, ttl) end
  return 'ok'
elseif op == 'revoke' then
  local only, now = ARGV[4], tonumber(ARGV[5])
  local ids = {}
  if only ~= '' then
    if redis.call('HEXISTS', k_shares, only) == 0 then
      if redis.call('EXISTS', k_revoked(only)) == 1 then return {'ok', {}, {}} end
      return {'not_found', {}, {}}
    end
    ids = {only}
  else
    ids = redis.call('HKEYS', k_shares)
  end
  local gone = {}
  for _, id in ipairs(ids) do
    local ok, rec = pcall(cjson.decode, redis.call('HGET', k_shares, id) or '')
    local left = 0
    if ok and type(rec) == 'table' and tonumber(rec.expires_at) then left = tonumber(rec.expires_at) * 1000 - now end
    if left > 0 then redis.call('SET', k_revoked(id), '1', 'PX', math.floor(left)) end
    redis.call('HDEL', k_shares, id)
    gone[id] = true
  end
  local removed = {}
  for _, member in ipairs(redis.call('ZRANGE', k_viewers, 0, -1)) do
    local share = string.match(member, '^(%S+)')
    if share and gone[share] then
      redis.call('ZREM', k_viewers, member)
      removed[#removed + 1] = member
    end
  end
  local controller = redis.call('GET', k_control)
  if controller and gone[string.match(controller, '^(%S+)') or ''] then redis.call('DEL', k_control) end
  if #ids > 0 then
    redis.call('PUBLISH', P .. ':sig:' .. sid .. ':shares', cjson.encode({type = 'share_revoked', shares = ids}))
  end
  return {'ok', ids, removed}
elseif op == 'control' then
  local viewer, hold, now = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
  local previous = redis.call('GET', k_control) or ''
  if viewer == '' then
    redis.call('DEL', k_control)
    return {'ok', previous}
  end
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', k_viewers, now, '+inf')) do
    if string.match(member, '^%S+ (%S+)$') == viewer then
      redis.call('SET', k_control, member, 'PX', hold)
      return {'ok', previous}
    end
  end
  return {'not_viewer', previous}
end

local id, viewer = ARGV[4], ARGV[5]
local member = id .. ' ' .. viewer
if op == 'join' then
  local hold, now = tonumber(ARGV[6]), tonumber(ARGV[7])
  if redis.call('EXISTS', k_revoked(id)) == 1 or redis.call('HEXISTS', k_shares, id) == 0 then return 'revoked' end
  local state = redis.call('HGET', k_session(sid), 'state')
  if not state or not SEATED[state] then return 'not_seated' end
  redis.call('ZADD', k_viewers, now + hold, member)
  redis.call('ZREMRANGEBYSCORE', k_viewers, '-inf', now)  -- holds whose broker died with the socket
  redis.call('PEXPIRE', k_viewers, hold)
  return 'ok'
elseif op == 'keep' then
  local hold, now = tonumber(ARGV[6]), tonumber(ARGV[7])
  if redis.call('ZSCORE', k_viewers, member) == false or redis.call('EXISTS', k_revoked(id)) == 1 then return 0 end
  redis.call('ZADD', k_viewers, now + hold, member)
  if redis.call('PTTL', k_viewers) < hold then redis.call('PEXPIRE', k_viewers, hold) end
  return 1
elseif op == 'leave' then
  if redis.call('GET', k_control) == member then redis.call('DEL', k_control) end
  return redis.call('ZREM', k_viewers, member)
end
return redis.error_reply('share.lua: unknown op ' .. tostring(op))
