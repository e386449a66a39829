-- Take the max-duration warning of a session, once. ARGV: prefix, session_id, now_ms
-- Returns 1 to the one caller that should send it, 0 to every other.
local sid, now = ARGV[2], ARGV[3]
if redis.call('ZREM', k_due_warn(), sid) == 0 then return 0 end
if redis.call('HGET', k_session(sid), 'state') == false then return 0 end
redis.call('HSET', k_session(sid), 'warned_ms', now)
return 1
