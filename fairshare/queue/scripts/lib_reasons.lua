-- The fair queue's library, part reasons: admission's reasons: why an entry waits, and where.
-- Runs after the parts before it (fairshare/queue/calls.py LIB_PARTS), as one file.

-- reasons (see fairshare/queue/calls.py explain) -------------------------------------

-- Why the tenant's quota holds an entry of shape D on top of its state st:
-- {'never'}, {'quota', slices} or {'borrow', slices}; nil when the quota allows it.
local function quota_blocker(tenant, D, st)
  local cfg = cfg_of(tenant)
  if never_fits(cfg, D) then return {'never'} end
  return quota_check(cfg, st, D)
end

-- Why the cluster holds an entry of shape D, given the holds G of its tier and the
-- held tops (plan): {'held', res, units held, units} when capacity is held for this
-- very entry (`me`: {tenant, shape} of a lane head) and some of what it lacks is held
-- already, else {'capacity', res, units missing}, {'reserve', res, units missing} when
-- the unused inference reserves are what a borrowed entry lacks, {'guard', res, tenant
-- it is held for}; nil when it fits.
local function capacity_blocker(D, G, held, me)
  local mine = nil
  for _, top in ipairs(held) do
    if me and top.tenant == me.tenant and top.shape == me.shape then mine = top end
  end
  if mine then
    local units = held_units(mine)
    for _, res in ipairs(D.all) do
      local need = (D.i[res] or 0) + (D.t[res] or 0) + (D.b[res] or 0)
      if units[res] > 0 and units[res] < need then return {'held', res, units[res], need} end
    end
    -- its own hold is not in its way
    local others = {i = {}, t = {}, b = {}}
    for band, counts in pairs(G) do
      for res, v in pairs(counts) do others[band][res] = v - (mine.hold[band][res] or 0) end
    end
    G = others
  end
  local c = cap_check(D, nil, false)
  if c then return {c[3] or 'capacity', c[1], c[2]} end
  c = cap_check(D, G, false)
  if not c then return nil end
  for _, top in ipairs(held) do
    if top ~= mine and (top.hold.i[c[1]] or top.hold.t[c[1]] or top.hold.b[c[1]]) then
      return {'guard', c[1], top.tenant}
    end
  end
  return {'guard', c[1], ''}
end

-- Queue entries (a pod or a whole gang) of the tenant's class that come before
-- sequence number `seq` (all of them when seq is nil): a binary search per lane, as
-- lanes are kept in admission order. `lanes`: the tenant's lanes if the caller holds
-- them (else read).
local function entries_before(tenant, cls, seq, lanes)
  local ahead = 0
  for _, shape in ipairs(lanes or redis.call('SMEMBERS', P .. 'tl:' .. tenant)) do
    if parse_shape(shape).cls == cls then
      local lane = lane_key(tenant, shape)
      local lo, hi = 0, redis.call('LLEN', lane)
      if seq == nil then lo = hi end
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        if entry_info(redis.call('LINDEX', lane, mid)) < seq then
          lo = mid + 1
        else
          hi = mid
        end
      end
      ahead = ahead + lo
    end
  end
  return ahead
end

local function free_slices(tenant)
  local st = state_of(tenant)
  return math.max(0, cfg_of(tenant).ns - num(st, 'ui') - num(st, 'ut'))
end

-- the shape of the lane a queued ticket waits in (nil while its gang is incomplete)
local function lane_of(rec)
  if rec[F_GANG] == '' then return single_shape(rec) end
  local sh = redis.call('HGET', P .. 'g:' .. rec[F_GANG], 'sh')
  if not sh or sh == '' then return nil end
  return sh
end

-- {position, queue length, reason...} of a known queued ticket
local function describe_queued(ticket, rec, now)
  local tenant, cls = rec[F_TENANT], rec[F_CLASS]
  local length = num(state_of(tenant), 'qc:' .. cls)
  local shape = lane_of(rec)
  if not shape then
    local g = hash_table(P .. 'g:' .. rec[F_GANG])
    return {0, length, 'gang', rec[F_GANG], num(g, 'r') + #gang_members(g), g.n,
            g.src or '', g.aw or ''}
  end
  local entry = rec[F_GANG] == '' and ticket or ('@' .. rec[F_GANG])
  local seq, at = entry_info(entry)
  local position = entries_before(tenant, cls, seq) + 1
  local D = parse_shape(shape)
  local st = state_of(tenant)
  local why = quota_blocker(tenant, D, st)
  local first = redis.call('LINDEX', lane_key(tenant, shape), 0)
  local head = first and unpack_entry(first) == entry
  if why == nil then
    -- the holds of the entries up to this one (its own, when it is held for)
    local me = {score = share_of(tenant, st, now), key = head_key(at, seq + 0.5)}
    local G, _, held = plan(D.tier, now, me, EMPTY)
    why = capacity_blocker(D, G, held, head and {tenant = tenant, shape = shape} or nil)
    -- a lane head that fits with nothing ahead in queue order is released next pass
    if why == nil and head and not ahead_of(D, now, me) then why = {'release'} end
  end
  if why == nil then
    if not head then
      why = {'ahead', position - 1}
    else
      why = {'turn'}
    end
  end
  local out = {position, length}
  for _, v in ipairs(why) do out[#out + 1] = v end
  return out
end
