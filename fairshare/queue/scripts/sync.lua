-- sync: ARGV[1] '1' replaces the capacity with ARGV[2] (counts), '0' keeps the stored
-- one; ARGV[3]: fairShare.usageHalfLife in seconds (0: current usage only, -1: virtual
-- time, lib_tenants.lua halflife); then, per
-- tenant, 6 fields: name, weight, borrow slices, reserve slices, nominal counts, the
-- reserve slices kept free of borrowed pods (kr: fairShare.lendInferenceReserve false).
-- Tenants not named lose their quota but keep their usage and queue. Readiness,
-- shares and the backlogged weights (bw, bm) are computed again; tw is the summed
-- weight of the named tenants (lib_tenants.lua guaranteed). A tenant whose budget
-- the dispatcher found exhausted (hash <prefix>budget, JSON with state 'exhausted';
-- fairshare/queue/budget.py) gets a borrow limit b of 0: it may not borrow, nominal is kept;
-- bc keeps the configured limit (admit: the band a pod can fit in at all).
if ARGV[1] == '1' then
  redis.call('DEL', K_CAP)
  for k, v in pairs(parse_counts(ARGV[2])) do redis.call('HSET', K_CAP, k, v) end
end
if redis.call('GET', P .. 'hl') ~= ARGV[3] then
  -- another half-life or order: the service counters start again from current usage
  local keys = {K_ACTIVE, P .. 'rt', K_HIGH_RUN}
  for _, tenant in ipairs(redis.call('SMEMBERS', K_TENANTS)) do keys[#keys + 1] = P .. 'du:' .. tenant end
  redis.call('DEL', unpack(keys))
  redis.call('SET', P .. 'hl', ARGV[3])
  HL = nil
end
redis.call('DEL', P .. 'bw', P .. 'bm', P .. 'fr')
local configured, total_weight = {}, 0
local function borrow_of(tenant, configured_limit)
  local budget = redis.call('HGET', P .. 'budget', tenant)
  if budget then
    local ok, status = pcall(cjson.decode, budget)
    if ok and type(status) == 'table' and status.state == 'exhausted' then return '0' end
  end
  return configured_limit
end
for i = 4, #ARGV, 6 do
  local tenant, nominal = ARGV[i], ARGV[i + 4]
  local key = P .. 'tc:' .. tenant
  configured[tenant] = true
  total_weight = total_weight + tonumber(ARGV[i + 1])
  redis.call('DEL', key)
  redis.call('HSET', key, 'w', ARGV[i + 1], 'b', borrow_of(tenant, ARGV[i + 2]),
             'bc', ARGV[i + 2], 'rs', ARGV[i + 3], 'kr', ARGV[i + 5],
             'ns', slices(parse_counts(nominal)), 'n', nominal)
  redis.call('SADD', K_TENANTS, tenant)
end
redis.call('SET', P .. 'tw', total_weight)
-- weights may have changed: va's scores are each active tenant's v as of its last fold
-- over its weight now (still lower bounds of its virtual time, which min_active walks by)
if halflife().virtual then
  for _, tenant in ipairs(redis.call('ZRANGE', K_ACTIVE, 0, -1)) do
    redis.call('ZADD', K_ACTIVE, 'XX', du_of(tenant).v / cfg_of(tenant).w, tenant)
  end
end
for _, tenant in ipairs(redis.call('SMEMBERS', K_TENANTS)) do
  if not configured[tenant] then redis.call('DEL', P .. 'tc:' .. tenant) end
  redis.call('HDEL', P .. 'ts:' .. tenant, 'bt')  -- bw and bm are counted again
  refresh(tenant)
end
count_idle_reserve()
return 1
