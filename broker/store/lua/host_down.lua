-- Expire a host whose lease is gone. ARGV: prefix, host_id, now_ms, down_ttl_s
-- Returns {status, ended ids...}; status down | alive | already | not_found.
local h, now, down_ttl = ARGV[2], ARGV[3], ARGV[4]
local key = k_host(h)
local state = redis.call('HGET', key, 'state')
if state == false then return {'not_found'} end
if state == 'down' then return {'already'} end
if redis.call('EXISTS', k_lease(h)) == 1 then return {'alive'} end
local out = {'down'}
for _, sid in ipairs(redis.call('SMEMBERS', k_host_sessions(h))) do
  end_session(sid, 'host_lost', now)
  table.insert(out, sid)
end
redis.call('DEL', k_host_sessions(h))
local gpus = cjson.decode(redis.call('HGET', key, 'gpus') or '[]')
for _, g in ipairs(gpus) do redis.call('HSET', key, 'u:' .. g['index'], 0) end
redis.call('HSET', key, 'state', 'down', 'down_ms', now)
redis.call('EXPIRE', key, down_ttl)
return out
