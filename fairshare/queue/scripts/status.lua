-- status: per known tenant (by name), a flat field/value list; `keys`/`ikeys`: its
-- running units per capacity key in all bands / in the inference band.
local names = redis.call('SMEMBERS', K_TENANTS)
table.sort(names)
local out = {}
for _, tenant in ipairs(names) do
  local c = cfg_of(tenant)
  local st = state_of(tenant)
  local used = {}
  for k, v in pairs(st) do
    local res = string.match(k, '^u:(.+)$')
    if res then used[res] = tonumber(v) end
  end
  local keys, ikeys = class_counts(st, 'k')
  out[#out + 1] = {'tenant', tenant, 'w', c.wraw, 'nominal', c.nominal,
                   'ns', tostring(c.ns), 'b', tostring(c.b), 'rs', tostring(c.rs),
                   'used', format_counts(used), 'ui', tostring(num(st, 'ui')),
                   'ut', tostring(num(st, 'ut')), 'ub', tostring(num(st, 'ub')),
                   'qci', tostring(num(st, 'qc:i')), 'qct', tostring(num(st, 'qc:t')),
                   'keys', format_counts(keys), 'ikeys', format_counts(ikeys)}
end
return out
