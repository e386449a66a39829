-- Create or replace a pool's config. ARGV: prefix, pool, now_ms, field, value, field, value...
-- Returns {created|updated, seated ids...}: a bigger pool may seat queued sessions at once.
local pool, now = ARGV[2], ARGV[3]
local key = k_pool(pool)
local existed = redis.call('EXISTS', key)
redis.call('DEL', key)
for i = 4, #ARGV, 2 do redis.call('HSET', key, ARGV[i], ARGV[i + 1]) end
redis.call('SADD', k_pools(), pool)
local out = {'created'}
if existed == 1 then out[1] = 'updated' end
for _, s in ipairs(pump(pool, now)) do table.insert(out, s) end
return out
