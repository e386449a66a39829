-- Record user activity. ARGV: prefix, session_id, last_active_ms.  Returns 1 if updated.
local key = k_session(ARGV[2])
local f = redis.call('HMGET', key, 'state', 'last_active_ms')
if f[1] == false or f[1] == 'ended' or f[1] == 'queued' then return 0 end
if tonumber(ARGV[3]) > tonumber(f[2] or '0') then redis.call('HSET', key, 'last_active_ms', ARGV[3]) end
return 1
