-- Record user activity. ARGV: prefix, session_id, last_active_ms.  Returns 1 if the session is seated.
local sid, at = ARGV[2], tonumber(ARGV[3])
local s = read_clock(sid)
if s == nil or s.state == 'ended' or s.state == 'queued' then return 0 end
if at > s.active then
  redis.call('HSET', k_session(sid), 'last_active_ms', at)
  s.active = at
  local t = read_timeouts(s.pool)
  if t.idle > 0 then schedule_with(sid, s, t) end
end
return 1
