-- demand: what entitlements need beside `status` (read only): the stored cluster
-- capacity as counts, then per known tenant (by name) its queued slices in all bands,
-- its queued inference slices, and its queued units per capacity key in all bands and
-- in the inference band (counts).
local names = redis.call('SMEMBERS', K_TENANTS)
table.sort(names)
local cap = {}
for res, n in pairs(hash_table(K_CAP)) do cap[res] = tonumber(n) end
local out = {format_counts(cap)}
for _, tenant in ipairs(names) do
  local st = state_of(tenant)
  local keys, ikeys = class_counts(st, 'qk')
  out[#out + 1] = tenant
  out[#out + 1] = tostring(num(st, 'qs:i') + num(st, 'qs:t') + num(st, 'qs:b'))
  out[#out + 1] = tostring(num(st, 'qs:i'))
  out[#out + 1] = format_counts(keys)
  out[#out + 1] = format_counts(ikeys)
end
return out
