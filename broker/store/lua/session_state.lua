-- Node-reported transition. ARGV: prefix, session_id, host_id, new_state, now_ms
-- new_state is running | disconnected.  Returns ok | not_found | wrong_host | ended | illegal.
local sid, host, new, now = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local s = read_clock(sid)
if s == nil then return 'not_found' end
if redis.call('HGET', k_session(sid), 'host') ~= host then return 'wrong_host' end
if s.state == 'ended' then return 'ended' end
if s.state == 'staged' then  -- the node has it ready: the next user gets it running
  staged_ready(sid, s.pool, now)
  return 'ok'
end
if s.state == new then return 'ok' end
local status = apply_state(sid, s, new, now)
if status == 'ok' then schedule_with(sid, s, read_timeouts(s.pool)) end
return status
