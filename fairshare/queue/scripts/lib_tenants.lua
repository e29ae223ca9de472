-- The fair queue's library, part tenants: tenants: quota, virtual time, shares.
-- Runs after the parts before it (fairshare/queue/calls.py LIB_PARTS), as one file.

-- tenants ----------------------------------------------------------------------------

local CFG = {}

-- weight w, borrow slices b (0 while the budget is exhausted), configured borrow slices
-- bc, reserve slices rs, reserve slices kept free of borrowed pods kr, nominal slices
-- ns, nominal per resource n
local function cfg_of(tenant)
  local c = CFG[tenant]
  if c then return c end
  -- a missing field (or hash) reads as false
  local w, n, ns, b, rs, bc, kr = unpack(redis.call('HMGET', P .. 'tc:' .. tenant, 'w', 'n',
                                                    'ns', 'b', 'rs', 'bc', 'kr'))
  c = {w = tonumber(w or '1'), wraw = w or '1', b = tonumber(b or '0'), rs = tonumber(rs or '0'),
       bc = tonumber(bc or b or '0'), kr = tonumber(kr or '0'),
       ns = tonumber(ns or '0'), n = parse_counts(n or ''), known = w ~= false, nominal = n or ''}
  CFG[tenant] = c
  return c
end

local function state_of(tenant)
  return hash_table(P .. 'ts:' .. tenant)
end

-- Add deltas {field = n} to the tenant's state: with st, the tenant's current state
-- (state_of, kept current by the caller), one HSET of the new values (st is updated);
-- else one HINCRBY per field.
local function bump_state(tenant, deltas, st)
  local key = P .. 'ts:' .. tenant
  if not st then
    for field, n in pairs(deltas) do redis.call('HINCRBY', key, field, n) end
    return
  end
  local args = {}
  for field, n in pairs(deltas) do
    st[field] = num(st, field) + n
    args[#args + 1] = field
    args[#args + 1] = st[field]
  end
  redis.call('HSET', key, unpack(args))
end

-- service received: virtual time (the default) or decayed usage (fairShare.usageHalfLife)
-- NOW: the caller's clock when the script knows it (scripts set it from ARGV), else nil.
-- du:<tenant> hash {v = slice-seconds of service as of t, t}: folded lazily, whenever the
-- tenant's usage changes (add_usage) with NOW known, u = slices in use since t.
-- Virtual time (hl < 0): D(now) = v + u * (now - t), the service received while active,
-- and a tenant that becomes active starts no lower than the active tenants (see
-- track_active): D / weight is its virtual time. Decayed usage (hl > 0):
-- D(now) = v * f + u * (1 - f) / L, f = exp(-L * (now - t)), L = ln 2 / half-life.
-- hl = 0: current usage only, no service is kept.
local NOW = nil
local HL = nil  -- {life = seconds (< 0 virtual time, 0 current usage), rate = L, accrues}

local function halflife()
  if not HL then
    local life = tonumber(redis.call('GET', P .. 'hl') or '0')
    HL = {life = life, rate = life > 0 and math.log(2) / life or 0, accrues = life ~= 0,
          virtual = life < 0}
  end
  return HL
end

local function usage_slices(st)
  return num(st, 'ui') + num(st, 'ut') + num(st, 'ub')
end

-- the tenant's state with only its usage fields (what share_of and usage_slices read)
local function usage_state(tenant)
  local u = redis.call('HMGET', P .. 'ts:' .. tenant, 'ui', 'ut', 'ub', 'rb')
  return {ui = u[1], ut = u[2], ub = u[3], rb = u[4]}
end

-- With virtual time, ts:<tenant> field rb = the sum over the tenant's running slices of
-- when each began (slices x start time), so that the service its running pods received
-- so far is usage_slices x now - rb (see share_of).
local function elapsed_service(st, now)
  local u = usage_slices(st)
  if u == 0 or not now then return 0 end
  return math.max(u * now - num(st, 'rb'), 0)
end

-- Start charge (see share_of): a tenant's expected run time is this (seconds) until one
-- of its pods has ended, then the moving average of its pods' run times, the newest
-- weighing RUN_WEIGHT.
local DEFAULT_RUN = 600
local RUN_WEIGHT = 0.25

-- capacity slices (all capacity keys) and the summed weight of the configured tenants
-- (`tw`, written by sync), read once per call
local CAP_SLICES, TOTAL_WEIGHT = nil, nil
local function cap_slices()
  if not CAP_SLICES then
    CAP_SLICES = 0
    local flat = redis.call('HGETALL', K_CAP)
    for i = 1, #flat, 2 do CAP_SLICES = CAP_SLICES + slices_of(flat[i]) * tonumber(flat[i + 1]) end
  end
  return CAP_SLICES
end

-- the slices the tenant is guaranteed when every configured tenant is busy: capacity x
-- its weight / the summed weight (0 before sync has written that sum)
local function guaranteed(tenant)
  if not TOTAL_WEIGHT then TOTAL_WEIGHT = tonumber(redis.call('GET', P .. 'tw') or '0') end
  if TOTAL_WEIGHT <= 0 then return 0 end
  return cap_slices() * cfg_of(tenant).w / TOTAL_WEIGHT
end

-- du:<tenant> as numbers {v, t (nil: never folded), r (nil: nothing learned)}, read
-- once per call per tenant; the writes below keep it current (a number written by a
-- script reads back exactly)
local DU = {}
local function du_of(tenant)
  local d = DU[tenant]
  if not d then
    local v, t, r = unpack(redis.call('HMGET', P .. 'du:' .. tenant, 'v', 't', 'r'))
    d = {v = tonumber(v or '0'), t = tonumber(t or ''), r = tonumber(r or '')}
    DU[tenant] = d
  end
  return d
end

-- the expected run time of a tenant none of whose pods has ended yet: with virtual time
-- the moving average of every tenant's run times (key rt), so a tenant that joins is
-- charged like those it joins; else (or before any pod ended) DEFAULT_RUN
local RUN = nil  -- false: no rt yet
local function stored_run()
  if RUN == nil then RUN = tonumber(redis.call('GET', P .. 'rt') or '') or false end
  return RUN
end
local function cluster_run()
  return halflife().virtual and stored_run() or DEFAULT_RUN
end

-- the tenant's expected run time: the moving average of its pods' run times, the
-- cluster's (cluster_run) before one of them ended
local function expected_run(tenant)
  return du_of(tenant).r or cluster_run()
end
-- rh: the highest rt since rt last fell (rescore_charged); none: unknown
local K_HIGH_RUN = P .. 'rh'

-- the tenant's service at `now` (nil: as of its last fold), with usage st, and its
-- expected run time
local function decayed(tenant, st, now)
  local d = du_of(tenant)
  local v, t, r = d.v, d.t or now or 0, expected_run(tenant)
  if not now or now <= t then return v, r end
  if halflife().virtual then return v + usage_slices(st) * (now - t), r end
  local f = math.exp(-halflife().rate * (now - t))
  return v * f + usage_slices(st) * (1 - f) / halflife().rate, r
end

-- va: with virtual time, the active tenants (slices in use or a lane), scored by their
-- virtual time as of their last fold: a lower bound of the current one, which only rises.
local K_ACTIVE = P .. 'va'

-- before the tenant's usage changes: fold its service up to NOW
local function fold_decay(tenant, st)
  if not halflife().accrues or not NOW then return end
  st = st or state_of(tenant)
  local v = decayed(tenant, st, NOW)
  redis.call('HSET', P .. 'du:' .. tenant, 'v', v, 't', NOW)
  local d = du_of(tenant)
  d.v, d.t = v, NOW
  if halflife().virtual then redis.call('ZADD', K_ACTIVE, 'XX', v / cfg_of(tenant).w, tenant) end
end

-- the smallest virtual time at NOW of the active tenants other than `tenant`, or nil:
-- members in stored order, until a stored bound cannot beat the best current value
local function min_active(tenant)
  local best, rank = nil, 0
  while true do
    local batch = redis.call('ZRANGE', K_ACTIVE, rank, rank + 15, 'WITHSCORES')
    if #batch == 0 then return best end
    for i = 1, #batch, 2 do
      if best and tonumber(batch[i + 1]) >= best then return best end
      local other = batch[i]
      if other ~= tenant then
        local v = decayed(other, usage_state(other), NOW) / cfg_of(other).w
        if not best or v < best then best = v end
      end
    end
    rank = rank + 16
  end
end

-- With virtual time, keep va current for a tenant with usage st and `lanes` lanes (nil:
-- counted here) whenever either changes: one that becomes active (NOW known) starts at
-- the smallest virtual time of the active tenants if its own is lower, so idle time
-- earns no credit while service taken ahead of the others is kept (repaid); one that
-- is idle leaves va.
local function track_active(tenant, st, lanes)
  if not halflife().virtual then return end
  local active = usage_slices(st) > 0
    or (lanes or redis.call('SCARD', P .. 'tl:' .. tenant)) > 0
  if active == (redis.call('ZSCORE', K_ACTIVE, tenant) ~= false) then return end
  if not active then
    redis.call('ZREM', K_ACTIVE, tenant)
    return
  end
  if not NOW then return end  -- joined by the next refresh that knows the time
  fold_decay(tenant, st)
  local w, d = cfg_of(tenant).w, du_of(tenant)
  local floor = min_active(tenant)
  if floor and d.v < floor * w then
    d.v = floor * w
    redis.call('HSET', P .. 'du:' .. tenant, 'v', d.v)
  end
  redis.call('ZADD', K_ACTIVE, d.v / w, tenant)
end

-- a running pod of the tenant that started at `started` ended at NOW: fold its run time
-- into the tenant's expected run time. Returns true when rt fell (see rescore_charged).
local function note_run(tenant, started)
  if not halflife().accrues or not NOW or not started then return false end
  local d = du_of(tenant)
  local run = math.max(NOW - started, 0)
  d.r = d.r and d.r + RUN_WEIGHT * (run - d.r) or run
  redis.call('HSET', P .. 'du:' .. tenant, 'r', d.r)
  if not halflife().virtual then return false end
  local before = stored_run()
  RUN = before and before + RUN_WEIGHT * (run - before) or run
  redis.call('SET', P .. 'rt', RUN)
  if RUN < (before or DEFAULT_RUN) then return true end
  local high = tonumber(redis.call('GET', K_HIGH_RUN) or '')
  if high and RUN > high then redis.call('SET', K_HIGH_RUN, RUN) end
  return false
end

-- A score below every real one (no decayed usage yet); see share_of.
local NO_USAGE = -1e18

-- The tenant's fair-share score (queue order: lowest first). Current usage only:
-- slices used in all bands / weight. Else ln((D(now) + charge) / weight) + L * now.
-- Virtual time (L = 0): charge = the slices it runs x its expected run time, the
-- virtual time it reaches when what runs now ends (start-time fair queuing's tag).
-- With a half-life: charge = the slices it runs beyond guaranteed(tenant) x its
-- expected run time. Either way a tenant is charged up front, so it cannot take every
-- unit freed at one moment while its service has not risen yet.
-- This orders tenants as (D(now) + charge) / weight does, and a tenant without running
-- pods keeps it unchanged as time passes (decay is uniform), while running pods only
-- raise it (with virtual time the charge falls only as fast as the service rises).
-- `now` nil: NOW, else as of the tenant's last fold. `credit` (slices, default 0): that
-- many slices x the expected run time are taken off (handover, see favoured_tops).
-- `bound`: the score a ready set stores (refresh, a tidying walk; survey relies on it),
-- a lower bound of the tenant's current score at every later time until its next
-- refresh, when nothing but the time and rt change: the score at max(now, t), t its
-- last fold (virtual time: the score falls as time goes back to t, where the elapsed
-- service of its running pods is counted as of t, the time its service is counted to;
-- a tenant never folded accrues no service, so its charge only falls: none), with its
-- expected run time; when that is rt, a fall of rt writes the score again
-- (rescore_charged). With a half-life the score never falls as time passes.
local function share_of(tenant, st, now, credit, bound)
  local hl = halflife()
  if not hl.accrues then return usage_slices(st) / cfg_of(tenant).w end
  now = now or NOW
  local charged = usage_slices(st)
  local d, run
  if hl.virtual then
    local t = du_of(tenant).t
    if not now or (bound and now < (t or now)) then now = t end
    if bound and not t then charged = 0 end
    d, run = decayed(tenant, st, now)
    -- start-time fair queuing: what runs is charged its whole expected run time at
    -- its start, so the service it received since is not counted twice
    d = d + math.max(charged * run - elapsed_service(st, now), 0) - (credit or 0) * run
  else
    d, run = decayed(tenant, st, now)
    charged = math.max(charged - guaranteed(tenant), 0)
    d = d + (charged - (credit or 0)) * run
  end
  if d <= 0 then return NO_USAGE end
  local t = now or du_of(tenant).t or 0
  return math.log(d / cfg_of(tenant).w) + hl.rate * t
end

-- The score a new entry of the tenant (usage st) joins the order with at NOW: with
-- virtual time, a tenant not in va yet is scored at the virtual time it joins at
-- (track_active, which runs once the entry is queued or reserved), without joining.
local function entry_share(tenant, st)
  if not halflife().virtual or not NOW or redis.call('ZSCORE', K_ACTIVE, tenant) then
    return share_of(tenant, st, NOW)
  end
  local d, w = du_of(tenant), cfg_of(tenant).w
  local v, t = d.v, d.t
  d.v, d.t = decayed(tenant, st, NOW), NOW
  local floor = min_active(tenant)
  if floor and d.v < floor * w then d.v = floor * w end
  local score = share_of(tenant, st, NOW)
  d.v, d.t = v, t
  return score
end

-- The slices of D's borrowed demand that the nominal quota training leaves unused can
-- hold, on top of state st and D's own non-borrowed demand (with `ahead`, counting the
-- training queued ahead too): nominal less the inference reserve, per resource and in
-- slices. A borrowed entry stands in that room and borrows only the rest, so an entry
-- that fits nominal + borrowLimit (the reserve kept) can run although it is larger
-- than either.
local function nominal_room(cfg, st, D, ahead)
  local q = ahead and 1 or 0
  local room = cfg.ns - cfg.rs - num(st, 'ut') - q * num(st, 'qs:t') - D.t_slices
  local held = 0
  for k, v in pairs(D.b_res) do
    local free = (cfg.n[k] or 0) - num(st, 'u:' .. k) - q * num(st, 'qd:t:' .. k) - (D.nb[k] or 0)
    if free > 0 then held = held + math.min(v, free) * slices_of(k) end
  end
  return math.max(0, math.min(room, held))
end

-- nil when the tenant's quota admits shape D (parse_shape) on top of state st, else
-- {code, slices}: non-borrowed demand within nominal (training's within nominal less
-- the inference reserve); borrowed demand within the borrow limit plus the nominal
-- room training leaves unused (nominal_room). Whatever the band, the tenant's total
-- stays within nominal + borrowLimit, and its training and borrowed slices within
-- nominal less the reserve + borrowLimit (invariant 1): a borrowed pod standing in
-- nominal room holds that room until it ends, and no pod of any band takes it from
-- under it (the configured borrow limit bounds these: an exhausted borrow budget stops
-- new borrowing, not nominal use).
local function quota_check(cfg, st, D)
  local missing = 0
  for _, k in ipairs(D.nb_keys) do
    local over = num(st, 'u:' .. k) + D.nb[k] - (cfg.n[k] or 0)
    if over > 0 then missing = missing + over * slices_of(k) end
  end
  if next(D.t) ~= nil then
    local over = num(st, 'ut') + D.t_slices - (cfg.ns - cfg.rs)
    if over > missing then missing = over end
  end
  local trained = num(st, 'ut') + num(st, 'ub') + D.t_slices + D.b_slices
  local limit = math.max(
    num(st, 'ui') + trained + slices(D.i) - (cfg.ns + cfg.bc),
    (next(D.t) ~= nil or next(D.b) ~= nil) and trained - (cfg.ns - cfg.rs + cfg.bc) or 0)
  if next(D.b) == nil then
    if limit > missing then missing = limit end
    if missing > 0 then return {'quota', missing} end
    return nil
  end
  if missing > 0 then return {'quota', missing} end
  local over = math.max(num(st, 'ub') + D.b_slices - cfg.b - nominal_room(cfg, st, D), limit)
  if over > 0 then return {'borrow', over} end
  return nil
end

local EMPTY = {}

-- D exceeds what the tenant's quota could ever admit: on an idle tenant, with its
-- configured borrow limit (a borrow budget that is exhausted now is not "never")
local function never_fits(cfg, D)
  local b = cfg.b
  cfg.b = cfg.bc
  local never = quota_check(cfg, EMPTY, D) ~= nil
  cfg.b = b
  return never
end
