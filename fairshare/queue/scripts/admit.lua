-- admit: reserve a pod now (fast path) or queue it; decide its band. ARGV: now,
-- dry (1 = write nothing), ticket, tenant, namespace, name, class, demand, gang id
-- ('' if none), gang size, submitted_at.
-- Returns {duplicate, outcome, band, position, queue length, free slices,
-- nominal slices, reason...}. ARGV[12] = 1: reserve nothing until rebuild has run.
-- A known ticket is the same admission again only when no pod was seen with it yet
-- (state R, Q or G, not bound to a uid) and namespace, name, tenant, class and demand
-- are identical; anything else is a copied ticket: {0, 'conflict', state, namespace,
-- name}. A queued entry, like a reservation, expires unless its pod is seen.
-- ARGV[13] = 1: the pod presented this ticket itself (a reinvocation); unless dry, a
-- ticket with no record was not minted here and is refused: {0, 'unminted'}.
-- ARGV[14] = 1: hold: never reserve, queue (reason 'claims': the dispatcher checks the
-- pod's DRA claims before it releases it).
-- ARGV[15], ARGV[16]: a gang member's gang source (e.g. 'Indexed Job trainer') and,
-- while its size is unknown, what the size awaits; kept in the gang's hash (src, aw)
-- for the words of why, status and the console.
-- ARGV[17]: the pod's declared run time in seconds ('' for none; F_RUN), which
-- backfill reads in place of its tenant's expected run time.
local now, dry = tonumber(ARGV[1]), ARGV[2] == '1'
local ticket, tenant, ns, name, cls, demand = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local gid, gsize, submitted = ARGV[9], ARGV[10], ARGV[11]
local wait_for_rebuild, presented = ARGV[12] == '1', ARGV[13] == '1'
local hold = ARGV[14] == '1'
local gsource, gawaiting = ARGV[15] or '', ARGV[16] or ''
local run = ARGV[17] or ''
NOW = now

local function reply(dup, outcome, band, position, length, free, nominal, reason)
  local out = {dup, outcome, band, position, length, free, nominal}
  for _, v in ipairs(reason) do out[#out + 1] = v end
  return out
end

local existing = get_rec(ticket)
if existing then
  local t, c = existing[F_TENANT], existing[F_CLASS]
  if existing[F_STATE] == 'A' or owner_of(existing) ~= '' or existing[F_NS] ~= ns or existing[F_NAME] ~= name
      or t ~= tenant or c ~= cls or existing[F_DEMAND] ~= format_counts(parse_counts(demand)) then
    return {0, 'conflict', existing[F_STATE], existing[F_NS], existing[F_NAME]}
  end
  if existing[F_STATE] == 'R' or existing[F_STATE] == 'A' then
    return reply(1, 'reserved', existing[F_BAND], 0, num(state_of(t), 'qc:' .. c),
                 free_slices(t), cfg_of(t).ns, {})
  end
  local d = describe_queued(ticket, existing, now)
  return reply(1, 'queued', existing[F_BAND], d[1], d[2], free_slices(t), cfg_of(t).ns,
               {unpack(d, 3)})
end

if presented and not dry then
  return {0, 'unminted'}
end

local cfg = cfg_of(tenant)
if not cfg.known then
  return redis.error_reply('unknown tenant: ' .. tenant .. ' (not configured)')
end
if gid ~= '' then
  local gang_class, gang_tenant = unpack(redis.call('HMGET', P .. 'g:' .. gid, 'c', 't'))
  if gang_class and gang_class ~= cls then
    return redis.error_reply('invalid: pod group ' .. gid .. ' mixes classes: every member of a '
      .. 'gang must have the same fairgate.io/class')
  end
  if gang_tenant and gang_tenant ~= tenant then
    return redis.error_reply('invalid: pod group ' .. gid .. ' mixes tenants: its members '
      .. 'were admitted under tenant ' .. gang_tenant .. ', this pod under tenant ' .. tenant
      .. ' (was the namespace\'s fairgate.io/tenant label changed?); every member of a gang must '
      .. 'be in the same tenant: delete the gang\'s pods and recreate the gang after '
      .. 'relabelling')
  end
end
local st = state_of(tenant)
local d = parse_counts(demand)
local ds = slices(d)

-- the band: inference; training within nominal (counting training queued ahead);
-- else borrowed within the borrow limit and the nominal room training leaves unused
-- (counting what is queued ahead); else, when both bands could hold it, the one whose
-- lane of its demand drains first for its room (entries queued in the lane / room;
-- entries of pods not seen yet count: a burst of creates is split as it arrives), so
-- that a backlog beyond both keeps nominal and borrow room in use;
-- else the band in which the pod can fit at all (training first; by the configured
-- borrow limit, so a pod larger than nominal admitted while the budget is exhausted
-- waits as borrowed for borrowing to be allowed again).
-- A gang's members share one band (preempting one member stops them all): the first
-- member decides it for the gang's whole demand (its size x the member's demand) and
-- the gang keeps it (bd); a replacement member rejoins in it.
local band = 'i'
local gang_band = gid ~= '' and redis.call('HGET', P .. 'g:' .. gid, 'bd')
if gang_band then
  band = gang_band
elseif cls == 't' then
  local whole = d
  if gid ~= '' then
    whole = {}
    for k, v in pairs(d) do whole[k] = v * tonumber(gsize) end
  end
  local ws = slices(whole)
  local W = parse_shape('b/' .. format_counts(whole))
  local training_room = cfg.ns - cfg.rs
  local fits = num(st, 'ut') + num(st, 'qs:t') + ws <= training_room
  local alone = ws <= training_room
  for k, v in pairs(W.b_res) do
    if num(st, 'u:' .. k) + num(st, 'qd:t:' .. k) + v > (cfg.n[k] or 0) then fits = false end
    if v > (cfg.n[k] or 0) then alone = false end
  end
  if fits then
    band = 't'
  elseif cfg.b > 0
      and num(st, 'ub') + num(st, 'qs:b') + ws <= cfg.b + nominal_room(cfg, st, W, true) then
    band = 'b'
  elseif alone and ws <= cfg.b then
    local lt = redis.call('LLEN', lane_key(tenant, 't/' .. format_counts(whole)))
    local lb = redis.call('LLEN', lane_key(tenant, 'b/' .. format_counts(whole)))
    band = (lb + 1) * training_room < (lt + 1) * cfg.b and 'b' or 't'
  elseif alone or ws > cfg.bc + nominal_room(cfg, EMPTY, W) then
    band = 't'
  else
    band = 'b'
  end
end

local counts = format_counts(d)
local D = parse_shape(band .. '/' .. counts)
local qc = num(st, 'qc:' .. cls)
local free = math.max(0, cfg.ns - num(st, 'ui') - num(st, 'ut'))
local reason = nil
local lanes = redis.call('SMEMBERS', P .. 'tl:' .. tenant)
local position = entries_before(tenant, cls, nil, lanes) + 1

if gid ~= '' then
  local g = hash_table(P .. 'g:' .. gid)
  local members = gang_members(g)
  local have = num(g, 'r') + #members + 1
  if have < tonumber(gsize) then
    reason = {'gang', gid, have, gsize, gsource, gawaiting}
    position = 0
  else
    -- the gang completes: what its whole entry waits for
    local G = {i = {}, t = {}, b = {}}
    for _, t in ipairs(members) do add_band_demand(G, get_rec(t)) end
    for k, v in pairs(d) do G[band][k] = (G[band][k] or 0) + v end
    local gang_shape = parse_shape(format_shape(G))
    reason = quota_blocker(tenant, gang_shape, st)
    if reason == nil then
      -- the holds of the entries ahead of the gang's (it joins its tier's order now)
      local me = {score = entry_share(tenant, st),
                  key = head_key(tonumber(submitted), math.huge)}
      -- nothing in its way: the dispatcher releases it whole on its next pass
      local G, _, held = plan(gang_shape.tier, now, me, EMPTY)
      reason = capacity_blocker(gang_shape, G, held)
      if reason == nil then
        reason = ahead_of(gang_shape, now, me) and {'turn'} or {'release'}
      end
    end
  end
else
  reason = quota_blocker(tenant, D, st)
  -- the cluster and the queue order are looked at only when the quota allows the pod:
  -- it would join its tier's order as {its tenant's score, submitted, last admitted}
  local ahead = nil
  if reason == nil then
    local me = {score = entry_share(tenant, st),
                key = head_key(tonumber(submitted), math.huge)}
    local G, held
    G, ahead, held = plan(band, now, me, d)
    reason = capacity_blocker(D, G, held)
  end
  if reason == nil then
    for k, _ in pairs(d) do
      if num(st, 'qr:' .. cls .. ':' .. k) > 0 then reason = {'ahead', qc} end
    end
  end
  -- nobody earlier in queue order that shares a resource and could be released now:
  -- a higher tier (inference; training for borrowed), or an entry ahead in this tier
  for _, tier in ipairs(TIERS) do
    if reason == nil and PRIO[tier] > PRIO[band] then
      local _, higher = plan(tier, now, nil, d)
      if higher then reason = {tier == 'i' and 'inference' or 'priority'} end
    end
  end
  if reason == nil and ahead then reason = {'turn'} end
end

if reason == nil and wait_for_rebuild and redis.call('EXISTS', K_REBUILT) == 0 then
  reason = {'rebuild'}
end
if reason == nil and hold then reason = {'claims'} end

if reason == nil then
  if band ~= 'b' then free = math.max(0, free - ds) end
  if dry then return reply(0, 'reserved', band, 0, qc, free, cfg.ns, {}) end
  local seq = redis.call('INCR', K_SEQ)
  put_rec(ticket, with_run({'R', tenant, cls, band, counts, ns, name, '', '1', submitted,
                            seq, ARGV[1], ''}, run))
  add_usage(tenant, band, d, 1, st)
  note_running(ticket, tenant, d, 1, nil, tonumber(run))
  index_name(ticket, {'R', tenant, cls, band, '', ns, name})
  resv_add(ticket, ARGV[1])
  redis.call('SADD', K_TENANTS, tenant)
  -- usage changed: lanes (none were added) are re-evaluated on the new state (st)
  if #lanes > 0 then refresh(tenant, st, NO_LANE) end
  return reply(0, 'reserved', band, 0, qc, free, cfg.ns, {})
end

if not dry then
  local seq = redis.call('INCR', K_SEQ)
  local rec = with_run({'Q', tenant, cls, band, counts, ns, name, gid, gsize, submitted,
                        seq, '', ''}, run)
  enqueue(ticket, rec, false, st)
  if gid ~= '' and gsource ~= '' then
    redis.call('HSET', P .. 'g:' .. gid, 'src', gsource, 'aw', gawaiting)
  end
  index_name(ticket, rec)
  resv_add(ticket, ARGV[1])
  -- queueing changes no usage: st holds what readiness and share depend on; of the
  -- lanes, only a single pod's own changed (a gang's completion may move others)
  refresh(tenant, st, gid == '' and {[single_shape(rec)] = true} or nil)
end
return reply(0, 'queued', band, position, qc + 1, free, cfg.ns, reason)
