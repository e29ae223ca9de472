-- service: the service counters a Redis loss would take (read-only): the order mode
-- (hl), the cluster's expected run time (rt, '' if none), the handover and commitment
-- hash fr (JSON), then per known tenant 5 fields: name, v, t, r of du:<tenant> ('' where
-- unset) and its score in va ('' when not active). restore writes them back.
local fr = hash_table(P .. 'fr')
local out = {redis.call('GET', P .. 'hl') or '', redis.call('GET', P .. 'rt') or '',
             next(fr) == nil and '{}' or cjson.encode(fr)}
for _, tenant in ipairs(redis.call('SMEMBERS', K_TENANTS)) do
  local v, t, r = unpack(redis.call('HMGET', P .. 'du:' .. tenant, 'v', 't', 'r'))
  local active = redis.call('ZSCORE', K_ACTIVE, tenant)
  for _, x in ipairs({tenant, v or '', t or '', r or '', active or ''}) do out[#out + 1] = x end
end
return out
