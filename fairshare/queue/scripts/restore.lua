-- restore: write back service counters read by `service` (same ARGV layout) once Redis
-- has lost its data (no rebuild since it was emptied: key rebuilt is missing), and only
-- under the order mode they were read under; fr when Redis has none. A tenant's counters are restored unless
-- it holds more service already (written after the loss, from less history); rt only
-- when unset. Returns the number of tenants restored.
if redis.call('EXISTS', K_REBUILT) == 1 then return 0 end
if (redis.call('GET', P .. 'hl') or '') ~= ARGV[1] then return 0 end
if ARGV[2] ~= '' and not redis.call('GET', P .. 'rt') then redis.call('SET', P .. 'rt', ARGV[2]) end
if ARGV[3] ~= '{}' and redis.call('EXISTS', P .. 'fr') == 0 then
  for k, v in pairs(cjson.decode(ARGV[3])) do redis.call('HSET', P .. 'fr', k, v) end
end
local restored = 0
for i = 4, #ARGV, 5 do
  local tenant, v, t, r, active = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  local key = P .. 'du:' .. tenant
  local held = tonumber(redis.call('HGET', key, 'v') or '')
  if v ~= '' and (not held or held < tonumber(v)) then
    redis.call('HSET', key, 'v', v)
    if t ~= '' then redis.call('HSET', key, 't', t) end
    if r ~= '' and not redis.call('HGET', key, 'r') then redis.call('HSET', key, 'r', r) end
    if active ~= '' then redis.call('ZADD', K_ACTIVE, active, tenant) end
    restored = restored + 1
  end
end
return restored
