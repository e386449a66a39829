-- ARGV: prefix, session_id, reason, now_ms
-- Returns {status, seated ids...}; status is ended | already_ended | not_found.
local sid, reason, now = ARGV[2], ARGV[3], ARGV[4]
local pool, status = end_session(sid, reason, now)
local out = {status}
if pool ~= nil then
  for _, s in ipairs(pump(pool, now)) do table.insert(out, s) end
end
return out
