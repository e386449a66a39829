-- Node-reported transition. ARGV: prefix, session_id, host_id, new_state, now_ms
-- new_state is running | disconnected.  Returns ok | not_found | wrong_host | ended | illegal.
local sid, host, new, now = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local key = k_session(sid)
local f = redis.call('HMGET', key, 'state', 'host', 'started_ms')
if f[1] == false then return 'not_found' end
if f[2] ~= host then return 'wrong_host' end
local cur = f[1]
if cur == 'ended' then return 'ended' end
if cur == new then return 'ok' end
local legal = (new == 'running' and (cur == 'starting' or cur == 'disconnected'))
           or (new == 'disconnected' and (cur == 'starting' or cur == 'running'))
if not legal then return 'illegal' end
redis.call('HSET', key, 'state', new)
if new == 'running' then
  if tonumber(f[3]) == 0 then redis.call('HSET', key, 'started_ms', now) end
  redis.call('HSET', key, 'disconnected_ms', 0, 'last_active_ms', now)
else
  redis.call('HSET', key, 'disconnected_ms', now)
end
publish_state(sid, new)
return 'ok'
