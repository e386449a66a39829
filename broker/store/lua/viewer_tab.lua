-- Which browser tab holds a session's viewer (the signaling socket that may talk to the node).
-- ARGV: prefix, session_id, op, tab, socket, ttl_ms.  The key (P:session:{id}:tab) holds
-- "<tab> <socket>": the tab, and which of its sockets (a reload or a reconnect of the same tab opens
-- a new one while the old one may still be closing).
--   op "claim": take it if free, held by this tab, or op is "take" -> {1, previous holder tab or ""}
--              held by another tab -> {0, holder tab}
--   op "take":  take it whoever holds it -> {1, previous holder tab or ""}
--   op "keep":  renew this socket's hold -> 1, or 0 when another socket took it (or it lapsed)
--   op "release": drop this socket's hold -> 1, or 0 when it is not this socket's (a newer one of the
--              same tab, or another tab, holds it: they stay)
-- The key lives ttl_ms past the last renewal, so a hold whose broker died with the socket lapses.
local sid, op, tab, sock, ttl = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local key = k_session(sid) .. ':tab'
local mine = tab .. ' ' .. sock
local cur = redis.call('GET', key)
if op == 'keep' then
  if cur ~= mine then return 0 end
  redis.call('PEXPIRE', key, ttl)
  return 1
elseif op == 'release' then
  if cur ~= mine then return 0 end
  redis.call('DEL', key)
  return 1
end
local holder = ''
if cur then holder = string.match(cur, '^(%S+)') or '' end
if cur and holder ~= tab and op ~= 'take' then return {0, holder} end
redis.call('SET', key, mine, 'PX', ttl)
return {1, holder}
