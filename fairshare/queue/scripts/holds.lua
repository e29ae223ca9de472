-- holds: the capacity held now (lib_holds.lua plan), per tier in queue order. ARGV: now.
-- Returns one list per held entry: tier, tenant, shape, held units (counts: the free
-- capacity not held for the entries before it, up to its demand), the lane head ('<ticket>' or '@<gang id>'),
-- namespace, name (of the head pod, or of the gang's first member).
local now = tonumber(ARGV[1])
local out = {}
for _, tier in ipairs(TIERS) do
  local _, _, held = plan(tier, now)
  for _, top in ipairs(held) do
    local entry = redis.call('LINDEX', lane_key(top.tenant, top.shape), 0)
    entry = entry and unpack_entry(entry) or ''
    local ticket = entry
    if string.sub(entry, 1, 1) == '@' then
      ticket = gang_members(hash_table(P .. 'g:' .. string.sub(entry, 2)))[1] or ''
    end
    local rec = get_rec(ticket) or {}
    out[#out + 1] = {tier, top.tenant, top.shape, format_counts(held_units(top)), entry,
                     rec[F_NS] or '', rec[F_NAME] or ''}
  end
end
return out
