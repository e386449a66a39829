-- Expire one host whose lease is gone. ARGV: prefix, host_id, now_ms, down_ttl_s
-- Returns {status, ended ids...}; status down | alive | already | not_found.
local h, now, down_ttl = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local state = redis.call('HGET', k_host(h), 'state')
if state == false then return {'not_found'} end
if state == 'down' then return {'already'} end
if redis.call('EXISTS', k_lease(h)) == 1 then return {'alive'} end
local out = {'down'}
for _, sid in ipairs(mark_down(h, now, down_ttl)) do table.insert(out, sid) end
return out
