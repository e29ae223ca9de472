-- demand: what entitlements need beside `status` (read only): the stored cluster
-- capacity as counts, then per known tenant (by name) its queued slices in all bands
-- and its queued inference slices.
local names = redis.call('SMEMBERS', K_TENANTS)
table.sort(names)
local cap = {}
for res, n in pairs(hash_table(K_CAP)) do cap[res] = tonumber(n) end
local out = {format_counts(cap)}
for _, tenant in ipairs(names) do
  local q = redis.call('HMGET', P .. 'ts:' .. tenant, 'qs:i', 'qs:t', 'qs:b')
  out[#out + 1] = tenant
  out[#out + 1] = tostring(tonumber(q[1] or '0') + tonumber(q[2] or '0') + tonumber(q[3] or '0'))
  out[#out + 1] = tostring(tonumber(q[1] or '0'))
end
return out
