-- Recompute the deadlines of sessions from their records. ARGV: prefix, now_ms, session ids...
-- A deadline that is not after now (the reaper's policy kept a session its deadline said was due:
-- the two disagree) is put one second ahead instead, so nothing is re-read in a tight loop.
-- Returns how many deadlines were clamped so.
local now = tonumber(ARGV[2])
local clamped = 0
for i = 3, #ARGV do
  local sid = ARGV[i]
  schedule(sid)
  local due = redis.call('ZSCORE', k_due_sessions(), sid)
  if due and tonumber(due) <= now then
    redis.call('ZADD', k_due_sessions(), now + 1000, sid)
    clamped = clamped + 1
  end
end
return clamped
