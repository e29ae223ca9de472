-- dispatch: release up to `limit` queue entries (a pod or a whole gang) in queue
-- order (lib_holds.lua plan): tiers inference, training, borrowed; then fair-share score; then
-- the oldest head; capacity held for the entry owed it. ARGV: now, limit, and
-- optionally the capacity (counts by capacity key) that entries are fitted against in
-- this call instead of the stored one, key by key (autoscaled pools: what they may grow
-- to; fair shares still use the stored capacity, the capacity that exists). Returns a
-- flat list of 7 fields per
-- released ticket: ticket, tenant, namespace, name, band, demand, submitted_at.
local now, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
NOW = now
if ARGV[3] then
  for res, n in pairs(parse_counts(ARGV[3])) do CAP[res] = n end
end
local out = {}

-- `entry`: the ticket as its lane held it (pack_entry), if at hand
local function release(ticket, entry)
  local rec = get_rec(ticket)
  count_queued(rec, -1)
  count_lane(rec, -1)
  add_usage(rec[F_TENANT], rec[F_BAND], parse_counts(rec[F_DEMAND]), 1)
  note_running(ticket, rec[F_TENANT], parse_counts(rec[F_DEMAND]), 1, nil,
               declared_run(rec))
  rec[F_STATE] = 'A'
  rec[F_AT] = ARGV[1]
  put_rec(ticket, rec)
  -- a pod never seen expires reservation_ttl after its release (see expire)
  if uid_of(rec) == '' then resv_add(ticket, ARGV[1], entry) end
  for _, v in ipairs({ticket, rec[F_TENANT], rec[F_NS], rec[F_NAME], rec[F_BAND],
                      rec[F_DEMAND], rec[F_SUBMITTED]}) do
    out[#out + 1] = v
  end
  return rec[F_TENANT]
end

local released = 0
while released < limit do
  local chosen = pick('i', now) or pick('t', now) or pick('b', now)
  if not chosen then break end
  local entry = redis.call('LPOP', lane_key(chosen.tenant, chosen.shape))
  if not entry then
    drop_stale(chosen.tenant, chosen.shape, chosen.member)
  elseif string.sub(entry, 1, 1) == '@' then
    local key = P .. 'g:' .. string.sub(entry, 2)
    local members = gang_members(hash_table(key))
    redis.call('HSET', key, 'm', '')
    redis.call('HDEL', key, 'sh')
    redis.call('HINCRBY', key, 'r', #members)
    -- members hold usage in their own tenants (one, unless written before admit
    -- refused gangs spanning tenants): each one's share and readiness changed
    local others, seen = {}, {[chosen.tenant] = true}
    for _, t in ipairs(members) do
      local tenant = release(t)
      if not seen[tenant] then
        seen[tenant] = true
        others[#others + 1] = tenant
      end
    end
    -- their lanes did not change (the gang waited in the chosen tenant's lane)
    for _, tenant in ipairs(others) do refresh(tenant, nil, NO_LANE) end
    released = released + 1
  else
    local ticket = unpack_entry(entry)
    release(ticket, ticket ~= entry and entry or nil)
    released = released + 1
  end
  refresh(chosen.tenant, nil, {[chosen.shape] = true})
end

return out
