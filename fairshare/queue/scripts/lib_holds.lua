-- The fair queue's library, part holds: holds and backfill: what capacity the order keeps for whom, and the plan.
-- Runs after the parts before it (fairshare/queue/calls.py LIB_PARTS), as one file.

-- Units of capacity key `res` free for an entry of `band` (bands of lower priority
-- count as free, as in cap_check); negative when the cluster is over capacity.
local function free_for(band, res)
  local used = 0
  for _, b2 in ipairs(BAND_ORDER) do
    if PRIO[b2] >= PRIO[band] then used = used + used_of(b2, res) end
  end
  return cap_of(res) - used
end

-- Whether some free capacity of a resource of shape D is not held yet (G: plan's holds)
local function unheld(D, G)
  for _, band in ipairs(BAND_ORDER) do
    for _, res in ipairs(D.keys[band]) do
      if free_for(band, res) - (G[band][res] or 0) > 0 then return true end
    end
  end
  return false
end

-- The head of the tenant's lane of `shape` as a survey top scored with `credit` slices
-- (share_of), and the tenant's state; nil when that lane is empty or not ready
local function lane_top(shape, tenant, now, credit)
  local st = state_of(tenant)
  if not st['rk:' .. shape] then return nil end
  local top = {shape = shape, D = parse_shape(shape), tenant = tenant}
  top.member = ready_member(st['rk:' .. shape], tenant)
  top.key = member_parts(top.member)
  top.score = share_of(tenant, st, now, credit)
  top.blocked = cap_check(top.D, nil, false)
  return top, st
end

-- Whether a tenant with `used` slices in use has completed the step of a commitment
-- begun at `base` slices (see note_hold): it runs one entry of shape D more
local function stepped(used, base, D)
  return used >= tonumber(base) + pod_slices(D)
end

-- With a half-life, the entries ordered otherwise than by their stored scores (one
-- entry when both are the same):
-- - the handover: the head of the lane whose running pod ended last (note_freed), until
--   the tier's next dispatch decision, scored with the credit of HANDOVER x its slices;
--   a tenant close to the front of the order keeps the block its own pod frees, so a
--   tenant of large pods does not wait for small pods to end each time it runs more
--   than one (the units freed while it waits are held, i.e. idle);
-- - the commitment (see note_hold): the head of the committed lane leads the walk once
--   capacity has been held for the lane's step for COMMIT_AFTER of its tenant's expected
--   run time, until the step is done.
-- Also returns the commitment record as read ({shape, tenant, base}; fields nil without
-- one), for note_hold.
local function favoured_tops(tier, now)
  if not halflife().accrues then return {}, {} end
  now = now or NOW
  local fs, ft, cs, ct, cu, ca = unpack(redis.call('HMGET', P .. 'fr', tier .. ':s',
                                                   tier .. ':t', tier .. ':cs', tier .. ':ct',
                                                   tier .. ':cu', tier .. ':ca'))
  local out = {}
  local committed = nil
  if cs and now then
    local top, st = lane_top(cs, ct, now, 0)
    if top and not stepped(usage_slices(st), cu, top.D) then
      local _, run = decayed(ct, st, nil)
      if now - tonumber(ca) >= COMMIT_AFTER * run then
        top.score = -math.huge
        committed = top
        out[1] = top
      end
    end
  end
  if fs then
    local freed = lane_top(fs, ft, now, HANDOVER * pod_slices(parse_shape(fs)))
    if freed and not (committed and committed.shape == freed.shape
                      and committed.member == freed.member) then
      out[#out + 1] = freed
    end
  end
  return out, {shape = cs, tenant = ct, base = cu}
end

-- How long a lane entry (as its lane holds it: pack_entry, or '@' .. gang id) is
-- expected to run when released now: its declared run time (a gang: the longest of its
-- members', when every member declares one), else its tenant's expected run time.
local function entry_run(entry, tenant)
  local tickets = {unpack_entry(entry)}
  if string.sub(entry, 1, 1) == '@' then
    tickets = gang_members(hash_table(P .. 'g:' .. string.sub(entry, 2)))
  end
  local run = nil
  for _, ticket in ipairs(tickets) do
    local declared = declared_run(get_rec(ticket))
    if not declared then return expected_run(tenant) end
    run = math.max(run or 0, declared)
  end
  return run or expected_run(tenant)
end

-- The expected end by which `units` of capacity key `res` come free, as the running
-- tickets of bands of priority >= `prio` end in their expected order (re:<res>): NOW
-- when one that must end first has outrun its expected end. When they never free that
-- many, the expected end of the last of them (NOW when none runs): `units` is then what
-- a held top and the held tops before it lack together, more than the running tickets
-- hold, so it fits only after they have all ended and some of the tops before it have
-- run; it is not expected to fit before.
local function drained_by(res, units, prio, now)
  local got, first, last = 0, 0, now
  while true do
    local rows = redis.call('ZRANGE', P .. 're:' .. res, first, first + 63, 'WITHSCORES')
    if #rows == 0 then return last end
    for j = 1, #rows, 2 do
      local rec = get_rec(rows[j])
      if rec and PRIO[rec[F_BAND]] >= prio then
        got = got + (parse_counts(rec[F_DEMAND])[res] or 0)
        last = math.max(tonumber(rows[j + 1]), now)
        if got >= units then return last end
      end
    end
    first = first + 64
  end
end

-- Backfill (virtual time): whether `top`, which fits the free capacity but not what is
-- held (plan), is expected to end (its tenant's expected run time from now) before
-- each held top sharing one of its resources is expected to fit. A held top is
-- expected to fit when, on each resource of its demand, the running tickets expected
-- to end first have freed what it and the held tops before it still lack
-- (drained_by); never before now, so nothing is backfilled once a ticket it waits for
-- outruns its expected end; when they never free that much (the held tops before it
-- take part of it first), not before the last of them ends. A held top's expected fit
-- is kept on it for the plan.
local function backfills(top, held, now)
  if #held == 0 or not now or not halflife().virtual then return false end
  local ends = now + entry_run(redis.call('LINDEX', lane_key(top.tenant, top.shape), 0),
                               top.tenant)
  local mine = {}
  for _, res in ipairs(top.D.all) do mine[res] = 1 end
  local lacking = {}
  for _, h in ipairs(held) do
    for _, band in ipairs(BAND_ORDER) do
      for _, res in ipairs(h.D.keys[band]) do
        lacking[res] = (lacking[res] or 0) + h.D[band][res] - (h.hold[band][res] or 0)
      end
    end
    if shares_resource(h.D, mine) then
      if h.fits_at == nil then
        h.fits_at = now
        for _, res in ipairs(h.D.all) do
          if lacking[res] > 0 then
            h.fits_at = math.max(drained_by(res, lacking[res], PRIO[h.D.tier], now),
                                 h.fits_at)
          end
        end
      end
      if ends > h.fits_at then return false end
    end
  end
  return true
end

-- The next entry of the tier to release, and the capacity held (see fairshare/queue/README.md
-- "Holding"). Walks the tier's tops (survey) in queue order, up to (not including)
-- entry `stop` (all with nil). A top that does not fit, given the holds of the tops
-- before it, is owed capacity when its tenant is below its weighted share and the
-- cluster could ever hold it: of each resource of its demand, the free units not yet
-- held for the tops before it are held for it, up to its demand (top.hold[band][res];
-- added to G[band][res]: no later entry of the band may use them). So the first owed
-- entry of a resource is served first, the next ones drain what is left, and G never
-- exceeds the free capacity of a band. With a half-life, queue order (decayed usage)
-- and the share test (current usage) can disagree: when an owed top's tenant is at or
-- above its share, the next tenant of its shape in queue order takes its place in the
-- walk (while some capacity of the shape is not held yet). Returns G, the first top that fits with the holds of the tops before it, or backfills (nil
-- if none; with `counts`, only a top sharing one of those resources counts, and the
-- walk goes on past the others), the held tops and the commitment record as read
-- (favoured_tops). `tidy`: see survey.
local BACKFILL_PEERS = 4  -- later tenants of a shape walked for backfill (plan)
local function plan(tier, now, stop, counts, tidy)
  -- current scores by tenant, shared by this plan's walks (see best_of)
  local scores = {}
  local tops = survey(tier, now, tidy, scores)
  -- the entries in the walk ('<shape> <member>'): each is walked once
  local listed = {}
  -- put `top` among tops, from index `from` on, in queue order
  local function place(top, from)
    local at = from
    while at <= #tops and before(tops[at], top) do at = at + 1 end
    table.insert(tops, at, top)
  end
  local favoured_list, record = favoured_tops(tier, now)
  for _, favoured in ipairs(favoured_list) do
    for j, top in ipairs(tops) do
      if top.member == favoured.member and top.shape == favoured.shape then
        table.remove(tops, j)
        break
      end
    end
    place(favoured, 1)
  end
  for _, top in ipairs(tops) do listed[top.shape .. ' ' .. top.member] = true end
  local G = {i = {}, t = {}, b = {}}
  local held, bw = {}, {}
  local decay = halflife().accrues
  -- The next tenant of the shape of tops[i] (`top`) in queue order not walked yet, put
  -- among the tops after i in queue order, with `top`'s survey check and `peer` (nil:
  -- it stands for its shape); whether there was one. (The handover's entry, or the one
  -- the survey found, may come after its top: those are skipped.)
  local function walk_on(top, i, peer)
    local next_top = best_of(top.shape, top.D, now, false, true, top, scores)
    while next_top and listed[next_top.shape .. ' ' .. next_top.member] do
      next_top = best_of(top.shape, top.D, now, false, true, next_top, scores)
    end
    if not next_top then return false end
    listed[next_top.shape .. ' ' .. next_top.member] = true
    next_top.blocked, next_top.peer = top.blocked, peer
    place(next_top, i + 1)
    return true
  end
  local i = 1
  while i <= #tops do
    local top = tops[i]
    if stop and not before(top, stop) then break end
    -- nothing held yet: the survey's check without holds is the answer
    local blocked = top.blocked
    if not blocked and #held > 0 then blocked = cap_check(top.D, G, false) end
    local substituted = false
    if not blocked or (not top.blocked and backfills(top, held, now)) then
      if not counts or shares_resource(top.D, counts) then return G, top, held, record end
    elseif not top.peer and cap_check(top.D, nil, true) == nil then
      if below_share(top, tier, bw) then
        top.hold = {i = {}, t = {}, b = {}}
        for _, band in ipairs(BAND_ORDER) do
          for _, res in ipairs(top.D.keys[band]) do
            local units = math.min(top.D[band][res], free_for(band, res) - (G[band][res] or 0))
            if units > 0 then
              top.hold[band][res] = units
              G[band][res] = (G[band][res] or 0) + units
            end
          end
        end
        held[#held + 1] = top
      elseif decay and unheld(top.D, G) then
        -- (without a half-life the set is ordered by usage / weight: no later tenant
        -- of the shape is below its share either; with nothing left to hold, a later
        -- one would hold nothing, and the walk, reading every tenant passed, would
        -- cost for nothing)
        substituted = walk_on(top, i, nil)
      end
    end
    -- Backfill peers (virtual time): a top that fits the free capacity but not what is
    -- held, and is expected to outlast the drain, does not stand for its shape's later
    -- tenants: backfill judges each tenant's run time, so the next tenant of the shape
    -- in queue order is walked after it, for backfill only (a peer is never held for),
    -- up to BACKFILL_PEERS of them, so that a later tenant of the shape whose pods end
    -- in time goes before a tenant of another shape further back in order.
    if blocked and not top.blocked and not substituted and #held > 0 and now
        and halflife().virtual and (top.peer or 0) < BACKFILL_PEERS then
      walk_on(top, i, (top.peer or 0) + 1)
    end
    i = i + 1
  end
  return G, nil, held, record
end

-- What is held for a held top (plan), per capacity key of its demand (all bands)
local function held_units(top)
  local units = {}
  for _, band in ipairs(BAND_ORDER) do
    for res, _ in pairs(top.D[band]) do
      units[res] = (units[res] or 0) + (top.hold[band][res] or 0)
    end
  end
  return units
end

-- Keep the commitment record of the tier (see COMMIT_AFTER) after a dispatch decision
-- that released `best` (nil: nothing fits, the dispatch round is over), held for the
-- tops `held` and read the record `record` (plan). A release of the lane's own entry
-- that gives its tenant the step ends the record; one that only replaces a pod of its
-- that ended does not. At the end
-- of a round the record stays while the lane is held for (some units held) and its step
-- is not complete; otherwise it moves to the first top held for, or is dropped.
-- Why: when a tenant of large pods steps up (holds units while others' pods end), the
-- tenants it waits on pass it in order a little (their usage falls while their pods
-- end) and take the freed units back; both then run the same slices per weight, the
-- order never changes for long, and the held units stay idle for good (bench seed 736:
-- 16% of the capacity for the whole horizon). A hold that has lasted that long is such
-- a standoff; leading the walk, the lane completes its step.
local function note_hold(tier, now, best, held, record)
  local key = P .. 'fr'
  local shape, tenant, base = record.shape, record.tenant, record.base
  -- whether `top` is an entry of the committed lane; whether its tenant's step is done
  local function of_lane(top) return shape and top.shape == shape and top.tenant == tenant end
  local function step_done(top) return stepped(usage_slices(usage_state(tenant)), base, top.D) end
  local function drop()
    redis.call('HDEL', key, tier .. ':cs', tier .. ':ct', tier .. ':cu', tier .. ':ca')
  end
  if best then
    if of_lane(best) and step_done(best) then drop() end
    return
  end
  local first = nil
  for _, top in ipairs(held) do
    if next(top.hold.i) or next(top.hold.t) or next(top.hold.b) then
      if of_lane(top) and not step_done(top) then return end
      first = first or top
    end
  end
  if first then
    redis.call('HSET', key, tier .. ':cs', first.shape, tier .. ':ct', first.tenant,
               tier .. ':cu', usage_slices(usage_state(first.tenant)), tier .. ':ca', now)
  elseif shape then
    drop()
  end
end

-- the first entry ahead of `me` in the order of D's tier that could be released now
-- and shares a resource with D (plan), nil when none
local function ahead_of(D, now, me)
  local mine = {}
  for _, res in ipairs(D.all) do mine[res] = 1 end
  local _, ahead = plan(D.tier, now, me, mine)
  return ahead
end

-- the next entry of a tier to release (a survey top), or nil; tidies (see survey)
local function pick(tier, now)
  local _, best, held, record = plan(tier, now, nil, nil, true)
  if halflife().accrues then
    -- the handover lasts one decision (note_freed writes it only with a half-life)
    redis.call('HDEL', P .. 'fr', tier .. ':s', tier .. ':t')
    note_hold(tier, now, best, held, record)
  end
  return best
end
