-- The viewer's tab is closing on purpose (pagehide).  ARGV: prefix, session_id, tab, now_ms.
-- Marks the session left (left_ms): once disconnected it ends after its pool's close_grace_s
-- instead of disconnect_timeout_s; a viewer connecting again clears the mark (apply_state).
-- Returns 1 when marked, 0 when the session is not seated, -1 when another tab holds its viewer
-- (that tab is still watching: the closing one leaves nothing behind).
local sid, tab, now = ARGV[2], ARGV[3], tonumber(ARGV[4])
local s = read_clock(sid)
if s == nil or s.state == 'ended' or s.state == 'queued' then return 0 end
local hold = redis.call('GET', k_session(sid) .. ':tab')
if hold and tab ~= '' and string.match(hold, '^(%S+)') ~= tab then return -1 end
redis.call('HSET', k_session(sid), 'left_ms', now)
s.left = now
schedule_with(sid, s, read_timeouts(s.pool))
return 1
