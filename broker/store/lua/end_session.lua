-- ARGV: prefix, session_id, reason, now_ms
-- Returns {status, seated ids...}; status is ended | already_ended | not_found | dropped (a staged session).
local sid, reason, now = ARGV[2], ARGV[3], ARGV[4]
local pool, status = end_session(sid, reason, now)
local out = {status}
if pool ~= nil then
  for _, s in ipairs(pump(pool, now)) do table.insert(out, s) end
  restage(pool, now)  -- a freed seat refills the pool's staged sessions once nobody queues
end
return out
