-- Shared helpers of the fair queue. The operations (<op>.lua) run on top of this file,
-- all in one Redis Function library (library.lua: this file runs once per key prefix,
-- KEYS[1]). Key layout, rules and the library: fairshare/queue/README.md.
--
-- Codes: class i|t (inference, training); band i|t|b (inference, training, borrowed);
-- ticket state Q (in a lane) | G (member of an incomplete gang) | R (reserved, not
-- confirmed) | A (running: confirmed or released).
-- A "shape" is what a queue entry asks for, per band: "t/gpu=1", or for a gang
-- "t/gpu=8+b/gpu=2". A lane is the FIFO of one tenant's entries of one shape.

local P = KEYS[1]
local PRIO = {i = 3, t = 2, b = 1}
local BAND_ORDER = {'i', 't', 'b'}
local TIERS = BAND_ORDER  -- dispatch serves tiers (the lowest band of a shape) in this order
local SEP = '|'
-- characters the API server appends to a pod's cut generateName (admission/pods.py)
local GENERATED_SUFFIX = 5
-- ticket record fields; F_UID is the uid of the pod the ticket is bound to ('' until
-- the dispatcher or a rebuild has seen that pod: the entry is "unseen")
local F_STATE, F_TENANT, F_CLASS, F_BAND, F_DEMAND, F_NS, F_NAME = 1, 2, 3, 4, 5, 6, 7
local F_GANG, F_GSIZE, F_SUBMITTED, F_SEQ, F_AT, F_UID = 8, 9, 10, 11, 12, 13
-- F_CLAIM: the uid of the pod the validating webhook saw CREATE with this ticket, before
-- the pod was stored ('' until then; a record without it has 13 fields): no other pod
-- can ever present the ticket, and only that uid can confirm it
local F_CLAIM = 14
-- F_RUN: the pod's declared run time in seconds (activeDeadlineSeconds of the pod, or of
-- its Job: an upper bound on how long it runs); '' or absent when it declares none
local F_RUN = 15

local K_TICKETS = P .. 'tk'
local K_RESV = P .. 'resv'
local K_USED = P .. 'used'
local K_CAP = P .. 'cap'
local K_TENANTS = P .. 'tenants'
local K_GANGS = P .. 'gangs'
local K_SEQ = P .. 'seq'
local K_REBUILT = P .. 'rebuilt'

local function split(s, sep)
  local out = {}
  local start = 1
  while true do
    local i = string.find(s, sep, start, true)
    if not i then
      out[#out + 1] = string.sub(s, start)
      return out
    end
    out[#out + 1] = string.sub(s, start, i - 1)
    start = i + 1
  end
end

-- A demand, usage or capacity key is a capacity key: the resource, '#<MIG strategy>'
-- unless its usual one, '@<node pool>' for pool nodes (tenants/placement.py), so
-- capacity and cluster usage are per placement class; quota and a tenant's usage
-- (u:<res>, qd:) count the resource (base_of).
local function base_of(key)
  return string.match(key, '^[^#@]*')
end

local function slices_of(key)
  local res = base_of(key)
  if res == 'gpu' then return 7 end
  return tonumber(string.match(res, '^mig%-(%d+)g%.'))
end

local function sorted_keys(map)
  local names = {}
  for k, v in pairs(map) do
    if v ~= 0 then names[#names + 1] = k end
  end
  table.sort(names)
  return names
end

local function parse_counts(s)
  local d = {}
  for k, v in string.gmatch(s, '([^,]+)=(%d+)') do
    d[k] = (d[k] or 0) + tonumber(v)
  end
  return d
end

local function format_counts(d)
  local parts = {}
  for _, k in ipairs(sorted_keys(d)) do
    parts[#parts + 1] = k .. '=' .. string.format('%d', d[k])
  end
  return table.concat(parts, ',')
end

-- counts by capacity key summed per resource (base_of): what quota counts
local function by_resource(d)
  local out = {}
  for k, v in pairs(d) do
    local res = base_of(k)
    out[res] = (out[res] or 0) + v
  end
  return out
end

local function slices(d)
  local s = 0
  for k, v in pairs(d) do s = s + slices_of(k) * v end
  return s
end

local function hash_table(key)
  local flat = redis.call('HGETALL', key)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

local function num(t, k)
  return tonumber(t[k] or '0')
end

-- shapes ---------------------------------------------------------------------------

local SHAPES = {}

-- x + y per resource (x or y itself when the other is empty; the result is only read)
local function sum_counts(x, y)
  if next(y) == nil then return x end
  if next(x) == nil then return y end
  local s = {}
  for k, v in pairs(x) do s[k] = v end
  for k, v in pairs(y) do s[k] = (s[k] or 0) + v end
  return s
end

local NONE = {}  -- the sorted resource names of a band without demand (never written)

-- {i=counts, t=counts, b=counts, all=sorted capacity keys, cls='i'|'t',
-- keys={i=, t=, b=: sorted capacity keys of the band}, nb=non-borrowed (i + t)
-- counts by resource (quota), nb_keys=its sorted names, t_slices, b_slices,
-- b_res=borrowed counts by resource}; read only
local function parse_shape(shape)
  local D = SHAPES[shape]
  if D then return D end
  D = {i = {}, t = {}, b = {}, keys = {i = NONE, t = NONE, b = NONE}}
  for band, counts in string.gmatch(shape, '(%a)/([^+]*)') do
    D[band] = parse_counts(counts)
    D.keys[band] = sorted_keys(D[band])
  end
  D.nb = by_resource(sum_counts(D.i, D.t))
  D.nb_keys = sorted_keys(D.nb)
  D.all = sorted_keys(sum_counts(sum_counts(D.i, D.t), D.b))
  D.t_slices, D.b_slices = slices(D.t), slices(D.b)
  D.b_res = by_resource(D.b)
  -- tier: the lowest band in the shape; dispatch serves tiers i, t, b in order
  D.tier = (next(D.i) ~= nil) and 'i' or ((next(D.b) ~= nil) and 'b' or 't')
  D.cls = (D.tier == 'i') and 'i' or 't'
  SHAPES[shape] = D
  return D
end

-- the slices of one entry of shape D (parse_shape), all bands
local function pod_slices(D)
  return slices(D.i) + D.t_slices + D.b_slices
end

local function format_shape(D)
  local parts = {}
  for _, band in ipairs(BAND_ORDER) do
    if next(D[band]) ~= nil then parts[#parts + 1] = band .. '/' .. format_counts(D[band]) end
  end
  return table.concat(parts, '+')
end

local function shares_resource(D, counts)
  for _, res in ipairs(D.all) do
    if (counts[res] or 0) > 0 then return true end
  end
  return false
end

local function lane_key(tenant, shape)
  return P .. 'q:' .. tenant .. ':' .. shape
end

-- tenants ----------------------------------------------------------------------------

local CFG = {}

-- weight w, borrow slices b (0 while the budget is exhausted), configured borrow slices
-- bc, reserve slices rs, nominal slices ns, nominal per resource n
local function cfg_of(tenant)
  local c = CFG[tenant]
  if c then return c end
  -- a missing field (or hash) reads as false
  local w, n, ns, b, rs, bc = unpack(redis.call('HMGET', P .. 'tc:' .. tenant, 'w', 'n', 'ns',
                                                'b', 'rs', 'bc'))
  c = {w = tonumber(w or '1'), wraw = w or '1', b = tonumber(b or '0'), rs = tonumber(rs or '0'),
       bc = tonumber(bc or b or '0'),
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

-- cluster capacity -----------------------------------------------------------------

-- read once per resource (a missing field reads as false): USED[res][band], CAP[res]
local USED = {}
local CAP = {}

local function used_of(band, res)
  local u = USED[res]
  if not u then
    local v = redis.call('HMGET', K_USED, 'i:' .. res, 't:' .. res, 'b:' .. res)
    u = {i = tonumber(v[1] or '0'), t = tonumber(v[2] or '0'), b = tonumber(v[3] or '0')}
    USED[res] = u
  end
  return u[band]
end

local function cap_of(res)
  local c = CAP[res]
  if not c then
    c = tonumber(redis.call('HGET', K_CAP, res) or '0')
    CAP[res] = c
  end
  return c
end

-- nil when D (parse_shape) fits the cluster for each of its bands (bands of lower
-- priority count as free), with guard reservations G[band][res] on top; else
-- {res, units missing}. `empty` evaluates against an idle cluster.
local function cap_check(D, G, empty)
  for _, band in ipairs(BAND_ORDER) do
    for _, res in ipairs(D.keys[band]) do
      local need = 0
      for _, b2 in ipairs(BAND_ORDER) do
        if PRIO[b2] >= PRIO[band] then
          need = need + (D[b2][res] or 0)
          if not empty then need = need + used_of(b2, res) end
        end
      end
      if G then need = need + (G[band][res] or 0) end
      local over = need - cap_of(res)
      if over > 0 then return {res, over} end
    end
  end
  return nil
end

-- `st`: see bump_state
-- `started`: when the usage being added (sign 1) or removed (-1) began; nil: NOW when
-- adding
-- k:<band>:<capacity key>: the tenant's running units per placement class and band,
-- borrowed included (what per-class entitlements read; nothing else does)
local function add_usage(tenant, band, d, sign, st, started)
  fold_decay(tenant, st)
  local deltas = {['u' .. band] = sign * slices(d)}
  for k, v in pairs(d) do
    if band ~= 'b' then
      local field = 'u:' .. base_of(k)
      deltas[field] = (deltas[field] or 0) + sign * v
    end
    deltas['k:' .. band .. ':' .. k] = sign * v
    local now_used = redis.call('HINCRBY', K_USED, band .. ':' .. k, sign * v)
    if USED[k] then USED[k][band] = now_used end
  end
  bump_state(tenant, deltas, st)
  if halflife().virtual then
    local key = P .. 'ts:' .. tenant
    local rb
    if (st and usage_slices(st) or usage_slices(usage_state(tenant))) == 0 then
      rb = 0
      redis.call('HDEL', key, 'rb')
    else
      -- usage that began at an unknown time (rebuilt without it) is left out both ways
      local at = started
      if at == nil and sign > 0 then at = NOW end
      if at then rb = tonumber(redis.call('HINCRBYFLOAT', key, 'rb', sign * slices(d) * at)) end
    end
    if st and rb then st.rb = rb end
  end
  track_active(tenant, st or usage_state(tenant))
end

-- a ticket record with its declared run time `run` (seconds as text, '' for none): a
-- record of 13 fields gets an empty F_CLAIM first (the same as none)
local function with_run(rec, run)
  if run ~= '' then
    rec[F_CLAIM] = rec[F_CLAIM] or ''
    rec[F_RUN] = run
  end
  return rec
end

-- the declared run time of a ticket record, nil when it declares none
local function declared_run(rec)
  return rec and tonumber(rec[F_RUN] or '')
end

-- Expected ends (backfill): each capacity key's running and reserved tickets in the
-- sorted set re:<capacity key>, scored by when they are expected to end: their start
-- plus their tenant's expected run time at that moment (the cluster's before one of
-- its pods ended), or their declared run time (`run`, seconds; nil: none) when that is
-- shorter: it is an upper bound. Kept in every order; only virtual time reads it
-- (backfills).
local function note_running(ticket, tenant, d, sign, started, run)
  if sign > 0 then
    local ends = (started or NOW or 0) + math.min(expected_run(tenant), run or math.huge)
    for k, _ in pairs(d) do redis.call('ZADD', P .. 're:' .. k, ends, ticket) end
  else
    for k, _ in pairs(d) do redis.call('ZREM', P .. 're:' .. k, ticket) end
  end
end

-- tickets ----------------------------------------------------------------------------

local function get_rec(ticket)
  local raw = redis.call('HGET', K_TICKETS, ticket)
  if not raw then return nil end
  return split(raw, SEP)
end

-- add a ticket record's demand to the per-band totals D ({i = {}, t = {}, b = {}})
local function add_band_demand(D, rec)
  for k, v in pairs(parse_counts(rec[F_DEMAND])) do
    D[rec[F_BAND]][k] = (D[rec[F_BAND]][k] or 0) + v
  end
end

local function put_rec(ticket, rec)
  redis.call('HSET', K_TICKETS, ticket, table.concat(rec, SEP))
end

-- the uid of the pod a ticket record is bound to, '' while unseen (a record written
-- before uids were recorded has 12 fields: unseen)
local function uid_of(rec)
  return rec[F_UID] or ''
end

-- the uid that owns a ticket: the one it is bound to (seen), else the one that claimed it
-- at validation, else ''
local function owner_of(rec)
  local uid = uid_of(rec)
  if uid ~= '' then return uid end
  return rec[F_CLAIM] or ''
end

-- whether `name` is the pod name a record admitted as `stored` can get: itself, or for
-- `<prefix>*` (a generateName, already cut as the API server cuts it) the prefix plus
-- exactly GENERATED_SUFFIX characters
local function name_fits(stored, name)
  if stored == name then return true end
  local prefix = string.sub(stored, 1, -2)
  return string.sub(stored, -1) == '*' and #name == #prefix + GENERATED_SUFFIX
    and string.sub(name, 1, #prefix) == prefix
end

-- name index (fairgate why <ns>/<pod>): NAME_BUCKETS small hashes nm:<b> (small
-- enough for Redis' compact listpack encoding at 100k pods), field = 48 bits of
-- sha1(namespace/name) as an integer, value = the ticket ('u' + 16 bytes for a
-- lowercase uuid, else 't' + the ticket). A hash collision only makes `find` miss.
local NAME_BUCKETS = 2048

local function name_slot(ns, name)
  local h = redis.sha1hex(ns .. '/' .. name)
  return P .. 'nm:' .. (tonumber(string.sub(h, 1, 3), 16) % NAME_BUCKETS),
    string.format('%d', tonumber(string.sub(h, 4, 15), 16))
end

-- positions of the first hex digit of each byte in a uuid string
local UUID_BYTES = {1, 3, 5, 7, 10, 12, 15, 17, 20, 22, 25, 27, 29, 31, 33, 35}
-- two lowercase hex digits -> the byte they write
local HEX_PAIR = (function()
  local t = {}
  for i = 0, 255 do t[string.format('%02x', i)] = string.char(i) end
  return t
end)()

-- the 16 bytes of a lowercase uuid ticket, nil for any other ticket
local function uuid_bytes(ticket)
  if #ticket ~= 36 or string.byte(ticket, 9) ~= 45 or string.byte(ticket, 14) ~= 45
      or string.byte(ticket, 19) ~= 45 or string.byte(ticket, 24) ~= 45 then  -- '-'
    return nil
  end
  local out = {}
  for j = 1, 16 do
    local i = UUID_BYTES[j]
    local byte = HEX_PAIR[string.sub(ticket, i, i + 1)]
    if not byte then return nil end
    out[j] = byte
  end
  return table.concat(out)
end

-- the uuid ticket of the 16 bytes at `from` .. `from` + 15 of `v`
local UUID_FORMAT = string.rep('%02x', 4) .. '-' .. string.rep('%02x', 2) .. '-'
  .. string.rep('%02x', 2) .. '-' .. string.rep('%02x', 2) .. '-' .. string.rep('%02x', 6)
local function uuid_text(v, from)
  return string.format(UUID_FORMAT, string.byte(v, from, from + 15))
end

-- A ticket as a member of an unseen-ticket bucket (rv:<b>) or an entry of a lane: a
-- lowercase uuid packed, PACKED and its 16 bytes (17 bytes, against 36); any other
-- ticket, and a gang's lane entry '@<gang id>', as it is. PACKED (byte 255) begins no
-- UTF-8 text, so a ticket written as text (by a version before packing, or not a uuid)
-- never reads as packed. An operation often packs one ticket several times (its lane,
-- its bucket, the name index): the last one packed is kept (PACK_IN, PACK_OUT; cleared
-- by begin()).
local PACKED = '\255'
local PACK_IN, PACK_OUT = nil, nil
local function pack_entry(entry)
  if entry == PACK_IN then return PACK_OUT end
  local bytes = uuid_bytes(entry)
  PACK_IN, PACK_OUT = entry, bytes and (PACKED .. bytes) or entry
  return PACK_OUT
end

local function unpack_entry(v)
  if #v ~= 17 or string.sub(v, 1, 1) ~= PACKED then return v end
  return uuid_text(v, 2)
end

-- the name index's form of a ticket: 'u' and its 16 bytes (a lowercase uuid), else 't'
-- and the ticket
local function pack_ticket(ticket)
  local packed = pack_entry(ticket)
  if packed == ticket then return 't' .. ticket end
  return 'u' .. string.sub(packed, 2)
end

local function unpack_ticket(v)
  if string.sub(v, 1, 1) == 't' then return string.sub(v, 2) end
  return uuid_text(v, 2)
end

-- Unseen tickets (no pod seen with them yet: reserved, queued or released), each with
-- the time it expires after (its admission or release): RESV_BUCKETS small sorted sets
-- rv:<b> (small enough for Redis' compact listpack encoding up to ~250k unseen tickets),
-- member = pack_entry(ticket), score = that time; b from sha1 of that member. The sorted
-- set rv indexes them: member b, score at most the lowest score in
-- rv:<b> (adding lowers it; removing leaves it, a lower bound, and expire raises it to
-- the lowest again). A version before buckets kept them all in one sorted set, `resv`
-- (member = the ticket): expire still reads it (see expire.lua), nothing else writes it.
local RESV_BUCKETS = 2048
local K_UNSEEN = P .. 'rv'

-- the bucket (its number, as text) of a ticket packed as `entry` (pack_entry): from
-- sha1, since tickets need not be random (a time-ordered uuid, a counter in a test's)
local function resv_bucket(entry)
  return string.format('%d', tonumber(string.sub(redis.sha1hex(entry), 1, 3), 16)
                             % RESV_BUCKETS)
end

-- the ticket expires after `at` (a time, as text or a number) unless its pod is seen
-- first; `entry`: pack_entry(ticket) if the caller has it
local function resv_add(ticket, at, entry)
  entry = entry or pack_entry(ticket)
  local b = resv_bucket(entry)
  redis.call('ZADD', K_UNSEEN .. ':' .. b, at, entry)
  redis.call('ZADD', K_UNSEEN, 'LT', at, b)
end

local function resv_remove(ticket)
  local entry = pack_entry(ticket)
  redis.call('ZREM', K_UNSEEN .. ':' .. resv_bucket(entry), entry)
end

-- the time after which the ticket expires, nil when it does not (its pod was seen)
local function resv_score(ticket)
  local entry = pack_entry(ticket)
  return redis.call('ZSCORE', K_UNSEEN .. ':' .. resv_bucket(entry), entry)
end

-- forget every unseen ticket's expiry (rebuild)
local function resv_clear()
  for first = 0, RESV_BUCKETS - 1, 256 do
    local keys = {}
    for b = first, first + 255 do
      keys[#keys + 1] = K_UNSEEN .. ':' .. string.format('%d', b)
    end
    redis.call('DEL', unpack(keys))
  end
  redis.call('DEL', K_UNSEEN, K_RESV)
end

local function index_name(ticket, rec)
  local key, field = name_slot(rec[F_NS], rec[F_NAME])
  redis.call('HSET', key, field, pack_ticket(ticket))
end

local function unindex_name(ticket, rec)
  local key, field = name_slot(rec[F_NS], rec[F_NAME])
  if redis.call('HGET', key, field) == pack_ticket(ticket) then
    redis.call('HDEL', key, field)
  end
end

-- the record takes the pod's own name (admitted as `<prefix>*`), in the name index too
local function take_name(ticket, rec, name)
  if rec[F_NAME] ~= name then
    unindex_name(ticket, rec)
    rec[F_NAME] = name
    index_name(ticket, rec)
  end
end

local function single_shape(rec)
  return rec[F_BAND] .. '/' .. rec[F_DEMAND]
end

-- qd:<band>:<res>, qs:<band> (queued demand, what admit counts as "queued ahead" when
-- it picks a band): queued tickets whose pod was seen (bound to a uid), so that an
-- entry whose pod never came to exist (a later admission step refused it) cannot push
-- a legitimate pod into the borrowed band (added to `deltas`); qk:<band>:<capacity key>
-- the same units per placement class (what per-class entitlements read)
local function seen_demand_deltas(rec, sign, deltas)
  local d = parse_counts(rec[F_DEMAND])
  for k, v in pairs(d) do
    local field = 'qd:' .. rec[F_BAND] .. ':' .. base_of(k)
    deltas[field] = (deltas[field] or 0) + sign * v
    field = 'qk:' .. rec[F_BAND] .. ':' .. k
    deltas[field] = (deltas[field] or 0) + sign * v
  end
  deltas['qs:' .. rec[F_BAND]] = (deltas['qs:' .. rec[F_BAND]] or 0) + sign * slices(d)
  return deltas
end

-- qc:<class> (queued tickets): every queued ticket, in a lane or in an incomplete
-- gang; and its queued demand once seen (added to `deltas`)
local function queued_deltas(rec, sign, deltas)
  deltas['qc:' .. rec[F_CLASS]] = (deltas['qc:' .. rec[F_CLASS]] or 0) + sign
  if uid_of(rec) ~= '' then seen_demand_deltas(rec, sign, deltas) end
  return deltas
end

-- qr:<class>:<res>: queued tickets in lanes (what the fast path must not jump)
-- (added to `deltas`)
local function lane_deltas(rec, sign, deltas)
  for k, _ in pairs(parse_counts(rec[F_DEMAND])) do
    local field = 'qr:' .. rec[F_CLASS] .. ':' .. k
    deltas[field] = (deltas[field] or 0) + sign
  end
  return deltas
end

-- a tenant's state (state_of) per placement class: its `<field>:<band>:<capacity key>`
-- counts (k: running, qk: queued) as units per key in all bands, and in band i. A
-- count below 0 reads as 0: a pod admitted by a version that kept no such counts and
-- freed by this one leaves one there until the next rebuild (the reconciler's).
local function class_counts(st, field)
  local all, inference = {}, {}
  local pattern = '^' .. field .. ':(%a):(.+)$'
  for k, v in pairs(st) do
    local band, key = string.match(k, pattern)
    if key then
      local n = math.max(0, tonumber(v))
      all[key] = (all[key] or 0) + n
      if band == 'i' then inference[key] = n end
    end
  end
  return all, inference
end

local function count_queued(rec, sign)
  bump_state(rec[F_TENANT], queued_deltas(rec, sign, {}))
end

local function count_lane(rec, sign)
  bump_state(rec[F_TENANT], lane_deltas(rec, sign, {}))
end

-- lanes and readiness ------------------------------------------------------------

-- bw: tier -> summed weight of the tenants with a ready lane of that tier; bm:
-- '<tier>:<tenant>' -> '1' for those tenants (the weighted-share test of survey); the
-- tenant's state keeps the same tiers as `bt` (e.g. 'tb'), so an unchanged set costs
-- no read of bm. sync deletes bw, bm and every `bt`, rebuild bw, bm and the states;
-- both refresh every tenant, which sets them again. `st`: the tenant's state, kept
-- current.
local function mark_backlogged(tenant, w, tiers, st)
  local now = ''
  for _, tier in ipairs(TIERS) do
    if tiers[tier] then now = now .. tier end
  end
  if (st.bt or '') == now then return end
  local fields = {}
  for i, tier in ipairs(TIERS) do fields[i] = tier .. ':' .. tenant end
  local was = redis.call('HMGET', P .. 'bm', unpack(fields))
  for i, tier in ipairs(TIERS) do
    if tiers[tier] and not was[i] then
      redis.call('HSET', P .. 'bm', fields[i], '1')
      redis.call('HINCRBYFLOAT', P .. 'bw', tier, w)
    elseif was[i] and not tiers[tier] then
      redis.call('HDEL', P .. 'bm', fields[i])
      redis.call('HINCRBYFLOAT', P .. 'bw', tier, -w)
    end
  end
  if now == '' then
    redis.call('HDEL', P .. 'ts:' .. tenant, 'bt')
    st.bt = nil
  else
    redis.call('HSET', P .. 'ts:' .. tenant, 'bt', now)
    st.bt = now
  end
end

-- rq: with virtual time, the tenants charged the cluster's expected run time rt (slices
-- in use, none of their pods ended) that have a ready lane, scored by the mean start
-- time of their running slices (rb / slices in use): their ready-set scores depend on rt
-- while their charge lasts, i.e. until that mean is rt old, and are written again when
-- rt falls (rescore_charged). `rq` in the tenant's state holds its score there, so an
-- unchanged one costs no write. sync and rebuild refresh every tenant, which sets both
-- again (rebuild deletes rq with the states).
local K_CHARGED = P .. 'rq'
local function mark_charged(tenant, st, ready)
  local mean = nil
  if ready and halflife().virtual and usage_slices(st) > 0 and not du_of(tenant).r then
    mean = num(st, 'rb') / usage_slices(st)
  end
  if mean == (st.rq and tonumber(st.rq)) then return end
  if mean then
    redis.call('ZADD', K_CHARGED, mean, tenant)
    redis.call('HSET', P .. 'ts:' .. tenant, 'rq', mean)
  else
    redis.call('ZREM', K_CHARGED, tenant)
    redis.call('HDEL', P .. 'ts:' .. tenant, 'rq')
  end
  st.rq = mean
end

-- a gang's queued members (g: its g:<gid> hash), in arrival order
local function gang_members(g)
  if (g.m or '') == '' then return {} end
  return split(g.m, ',')
end

-- seq and submitted time of a lane entry, as stored (pack_entry) or not (a gang: its
-- newest member)
local function entry_info(entry)
  if string.sub(entry, 1, 1) ~= '@' then
    local rec = get_rec(unpack_entry(entry))
    return tonumber(rec[F_SEQ]), tonumber(rec[F_SUBMITTED])
  end
  local seq, at = 0, 0
  for _, ticket in ipairs(gang_members(hash_table(P .. 'g:' .. string.sub(entry, 2)))) do
    local rec = get_rec(ticket)
    seq = math.max(seq, tonumber(rec[F_SEQ]))
    at = math.max(at, tonumber(rec[F_SUBMITTED]))
  end
  return seq, at
end

-- Ready-set members order ties of the score themselves: a member is head_key(at, seq)
-- of the lane's head entry, a space and the tenant name, so the first member of equal
-- scores is the head created first (then admitted first). head_key: 32 hex digits,
-- two doubles encoded so that string order is numeric order (sign bit flipped for
-- x >= 0, every bit for x < 0).
local HEAD_KEY_LEN = 32
local function sortable(x)
  if x == 0 then x = 0 end  -- -0 sorts as 0
  local b = {string.byte(struct.pack('>d', x), 1, 8)}
  if x < 0 then
    for i = 1, 8 do b[i] = 255 - b[i] end
  else
    b[1] = b[1] + 128
  end
  return string.format('%02x%02x%02x%02x%02x%02x%02x%02x', unpack(b))
end

local function head_key(at, seq)
  return sortable(at) .. sortable(seq)
end

-- the ready-set member of a tenant's lane: its head key, a space (no tenant name, a
-- label value, has one), the tenant
local function ready_member(rk, tenant)
  return string.sub(rk, 1, HEAD_KEY_LEN) .. ' ' .. tenant
end

-- head key and tenant of a ready-set member; a member written before members carried
-- the head key is the bare tenant name (key '': first among equal scores)
local function member_parts(member)
  if string.sub(member, HEAD_KEY_LEN + 1, HEAD_KEY_LEN + 1) ~= ' ' then return '', member end
  return string.sub(member, 1, HEAD_KEY_LEN), string.sub(member, HEAD_KEY_LEN + 2)
end

-- Put each of the tenant's lanes into the ready set of its shape (score = share_of,
-- member = ready_member) when its head fits the tenant's quota, else take it out;
-- drop empty lanes. The member in the set is remembered in
-- the tenant's state (`rk:<shape>`: head_key .. head entry as the lane holds it, 49
-- bytes for a uuid ticket, so the state stays a small listpack hash; the head key of a
-- single pod entry never changes, so an unchanged head is not read again).
-- `st`: the tenant's state if the caller holds it current (else read); kept current.
-- `moved`: nil when any of the tenant's lanes may have changed since its last refresh;
-- else the set {shape = true} of the lanes that may have (pushed, popped, removed
-- from): the head of any other lane with a remembered member is that member's entry,
-- and is not read. NO_LANE: none did.
local NO_LANE = {}
local function refresh(tenant, st, moved)
  local cfg = cfg_of(tenant)
  st = st or state_of(tenant)
  local lanes_key = P .. 'tl:' .. tenant
  local lanes = redis.call('SMEMBERS', lanes_key)
  -- each lane's head (true: the remembered member's entry, not read); the tenant is
  -- active by the lanes left once the emptied ones are dropped
  local heads, live = {}, 0
  for i, shape in ipairs(lanes) do
    local known = st['rk:' .. shape] and moved and not moved[shape]
    heads[i] = known or redis.call('LINDEX', lane_key(tenant, shape), 0)
    if heads[i] then live = live + 1 end
  end
  track_active(tenant, st, live)
  local share = share_of(tenant, st, nil, 0, true)
  local tiers = {}
  for i, shape in ipairs(lanes) do
    local ready = P .. 'r:' .. shape
    local field = 'rk:' .. shape
    local old = st[field]
    local known = old and moved and not moved[shape]
    local head = heads[i]
    local new = nil
    if not head then
      redis.call('SREM', lanes_key, shape)
    else
      local D = parse_shape(shape)
      if quota_check(cfg, st, D) == nil then
        tiers[D.tier] = true
        if known or (old and string.sub(head, 1, 1) ~= '@'
                     and string.sub(old, HEAD_KEY_LEN + 1) == head) then
          new = old
        else
          local seq, at = entry_info(head)
          new = head_key(at, seq) .. head
        end
      end
    end
    -- without a remembered member, a set written before members carried the head key
    -- may hold the bare tenant name
    local old_member = old and ready_member(old, tenant) or tenant
    local new_member = new and ready_member(new, tenant)
    if old_member ~= new_member then redis.call('ZREM', ready, old_member) end
    if new and redis.call('ZADD', ready, share, new_member) == 1 then
      redis.call('SADD', P .. 'sh:' .. parse_shape(shape).tier, shape)
    end
    if old ~= new then
      if new then
        redis.call('HSET', P .. 'ts:' .. tenant, field, new)
      else
        redis.call('HDEL', P .. 'ts:' .. tenant, field)
      end
      st[field] = new
    end
  end
  mark_backlogged(tenant, cfg.w, tiers, st)
  mark_charged(tenant, st, next(tiers) ~= nil)
end

-- Write the tenant's ready-set scores again (share_of's bound as of NOW, else as of its
-- last fold), nothing else; `st`: its state (state_of).
local function rescore(tenant, st)
  local share = share_of(tenant, st, nil, 0, true)
  for field, head in pairs(st) do
    if string.sub(field, 1, 3) == 'rk:' then
      redis.call('ZADD', P .. 'r:' .. string.sub(field, 4), 'XX', share,
                 ready_member(head, tenant))
    end
  end
end

-- rt fell (note_run): the scores of the tenants in rq whose charge may still last (mean
-- start of their running slices later than NOW less rh, the highest rt since the last
-- such rescoring: no stored score used more) are written again with the new rt. Those
-- whose charge is over would score the same with any rt not above the one they used:
-- their score only grew since. So the work is per young tenant charged rt, not per
-- tenant: at most the tenants none of whose pods ended yet. Without NOW or rh (none
-- since rt was deleted): every tenant in rq.
local function rescore_charged()
  local high = NOW and tonumber(redis.call('GET', K_HIGH_RUN) or '')
  local young = high
    and redis.call('ZRANGEBYSCORE', K_CHARGED, string.format('%.17g', NOW - high), '+inf')
    or redis.call('ZRANGE', K_CHARGED, 0, -1)
  for _, tenant in ipairs(young) do rescore(tenant, state_of(tenant)) end
  redis.call('SET', K_HIGH_RUN, cluster_run())
end

-- a lane holds its entries as pack_entry makes them: a uuid ticket in 17 bytes
local function push_lane(tenant, shape, entry, at_head)
  redis.call(at_head and 'LPUSH' or 'RPUSH', lane_key(tenant, shape), pack_entry(entry))
  redis.call('SADD', P .. 'tl:' .. tenant, shape)
end

-- gangs ----------------------------------------------------------------------------
-- g:<gid> hash: t tenant, c class, n size, m queued members (comma list, arrival
-- order), r members running, sh shape of its lane entry while linked, bd the band
-- of its members (its first member's: admit gives every member that one), src and aw
-- where the gang was declared and what its unknown size awaits (words only: admit
-- writes them, nothing decides by them); gang_members and entry_info are above (ready
-- sets read them).

-- take a linked gang out of its lane: members back to G
local function gang_unlink(gid)
  local key = P .. 'g:' .. gid
  local g = hash_table(key)
  if (g.sh or '') == '' then return end
  redis.call('LREM', lane_key(g.t, g.sh), 1, '@' .. gid)
  for _, ticket in ipairs(gang_members(g)) do
    local rec = get_rec(ticket)
    count_lane(rec, -1)
    rec[F_STATE] = 'G'
    put_rec(ticket, rec)
  end
  redis.call('HDEL', key, 'sh')
end

-- link a gang into its lane once running + queued members reach its size
local function gang_link(gid, at_head)
  local key = P .. 'g:' .. gid
  local g = hash_table(key)
  local members = gang_members(g)
  if #members == 0 then
    if num(g, 'r') <= 0 then
      redis.call('DEL', key)
      redis.call('SREM', K_GANGS, gid)
    end
    return
  end
  if num(g, 'r') + #members < num(g, 'n') then return end
  local D = {i = {}, t = {}, b = {}}
  for _, ticket in ipairs(members) do
    local rec = get_rec(ticket)
    add_band_demand(D, rec)
    count_lane(rec, 1)
    rec[F_STATE] = 'Q'
    put_rec(ticket, rec)
  end
  local shape = format_shape(D)
  redis.call('HSET', key, 'sh', shape)
  push_lane(g.t, shape, '@' .. gid, at_head)
end


-- queue a new ticket record (state Q or G is decided here); rec[F_SEQ] must be set.
-- `st`: see bump_state (a gang member's counters are written without it)
local function enqueue(ticket, rec, at_head, st)
  local gid = rec[F_GANG]
  if gid == '' then
    bump_state(rec[F_TENANT], lane_deltas(rec, 1, queued_deltas(rec, 1, {})), st)
    rec[F_STATE] = 'Q'
    put_rec(ticket, rec)
    push_lane(rec[F_TENANT], single_shape(rec), ticket, at_head)
    return
  end
  count_queued(rec, 1)
  rec[F_STATE] = 'G'
  put_rec(ticket, rec)
  local key = P .. 'g:' .. gid
  gang_unlink(gid)
  -- the gang keeps the tenant it was created with (its lane is that tenant's)
  local m, t, n = unpack(redis.call('HMGET', key, 'm', 't', 'n'))
  -- the latest member's size, unless it is unknown (1000000, model.UNKNOWN_GANG_SIZE)
  -- and the gang's is known
  if not n or rec[F_GSIZE] ~= '1000000' then n = rec[F_GSIZE] end
  redis.call('HSET', key, 't', t or rec[F_TENANT], 'c', rec[F_CLASS], 'n', n,
             'm', (m and m ~= '') and (m .. ',' .. ticket) or ticket)
  redis.call('HSETNX', key, 'bd', rec[F_BAND])
  redis.call('SADD', K_GANGS, gid)
  gang_link(gid, at_head)
end

-- take a queued ticket (Q or G) out of the queue; its record stays. Returns the
-- tenant whose lane changed (a gang member's: the gang's tenant)
local function dequeue(ticket, rec)
  count_queued(rec, -1)
  local gid = rec[F_GANG]
  if gid == '' then
    local lane, entry = lane_key(rec[F_TENANT], single_shape(rec)), pack_entry(ticket)
    if redis.call('LREM', lane, 1, entry) == 0 and entry ~= ticket then
      redis.call('LREM', lane, 1, ticket)  -- a lane written before entries were packed
    end
    count_lane(rec, -1)
    return rec[F_TENANT]
  end
  local key = P .. 'g:' .. gid
  gang_unlink(gid)
  local g = hash_table(key)
  local kept = {}
  for _, t in ipairs(gang_members(g)) do
    if t ~= ticket then kept[#kept + 1] = t end
  end
  redis.call('HSET', key, 'm', table.concat(kept, ','))
  gang_link(gid, false)
  return g.t or rec[F_TENANT]
end

-- count a gang member that starts (+1) or stops (-1) running; returns the gang's
-- tenant (its lane may have changed), nil without a gang
local function gang_running(gid, sign)
  if gid == '' then return nil end
  local t = redis.call('HGET', P .. 'g:' .. gid, 't')
  if not t then return nil end
  gang_unlink(gid)
  redis.call('HINCRBY', P .. 'g:' .. gid, 'r', sign)
  gang_link(gid, false)
  return t
end

-- refresh the tenant of a ticket and, when another, the tenant whose lane changed
-- (a gang's members may belong to other tenants in a Redis written before admit
-- refused that)
local function refresh_both(tenant, other)
  refresh(tenant)
  if other and other ~= tenant then refresh(other) end
end

-- Handover (with a half-life): a running pod that ends frees a block of its shape, and
-- its tenant's next entry of that shape (same lane) is ordered, until its tier's next
-- dispatch decision, as if HANDOVER of one such pod's usage were not counted (see
-- favoured_tops). fr hash: '<tier>:s' lane shape, '<tier>:t' tenant of the last such pod.
local HANDOVER = 0.5
local function note_freed(rec)
  if not halflife().accrues or rec[F_GANG] ~= '' then return end
  local shape = single_shape(rec)
  local tier = parse_shape(shape).tier
  redis.call('HSET', P .. 'fr', tier .. ':s', shape, tier .. ':t', rec[F_TENANT])
end

-- Commitment (with a half-life): the fr hash also records, per tier, the lane capacity
-- is held for at the end of dispatch rounds ('<tier>:cs' shape, '<tier>:ct' tenant), its
-- tenant's slices in use when that began ('<tier>:cu') and when ('<tier>:ca'); see
-- note_hold. Once that has lasted COMMIT_AFTER x the tenant's expected run time, the
-- lane's head leads its tier's walk until its tenant runs one such entry more than then
-- (favoured_tops).
local COMMIT_AFTER = 0.5

-- free whatever the ticket holds and forget it. `reclaimed`: its pod was evicted by
-- reclaim, for another tenant owed the capacity: its tenant gets no handover of the
-- block (it would take back what was freed for the owed one), and its cut run teaches
-- nothing of how long its tenant's pods run
local function forget(ticket, rec, reclaimed)
  local state = rec[F_STATE]
  local changed
  unindex_name(ticket, rec)
  resv_remove(ticket)
  if state == 'R' or state == 'A' then
    if state == 'A' and not reclaimed then
      if note_run(rec[F_TENANT], tonumber(rec[F_AT])) then rescore_charged() end
      note_freed(rec)
    end
    add_usage(rec[F_TENANT], rec[F_BAND], parse_counts(rec[F_DEMAND]), -1, nil,
              tonumber(rec[F_AT]))
    note_running(ticket, rec[F_TENANT], parse_counts(rec[F_DEMAND]), -1)
    redis.call('HDEL', K_TICKETS, ticket)
    changed = gang_running(rec[F_GANG], -1)
  else
    changed = dequeue(ticket, rec)
    redis.call('HDEL', K_TICKETS, ticket)
  end
  refresh_both(rec[F_TENANT], changed)
end

-- ordering ---------------------------------------------------------------------------


local function tier_shapes(tier)
  return redis.call('SMEMBERS', P .. 'sh:' .. tier)
end

-- A tenant in a ready set whose lane is empty is stale (a Redis written before admit
-- refused gangs spanning tenants could move a gang to another tenant's lane without
-- refreshing the first): it is skipped, and dropped by writing scripts. `member`: its
-- member in the ready set.
local function drop_stale(tenant, shape, member)
  redis.call('ZREM', P .. 'r:' .. shape, member)
  redis.call('SREM', P .. 'tl:' .. tenant, shape)
  redis.call('HDEL', P .. 'ts:' .. tenant, 'rk:' .. shape)
end

-- Queue order of two entries {score, key = head_key(submitted_at, seq)}: the lower
-- fair-share score, then the head pod created first (submitted_at), then admitted
-- first (seq). Never the name.
local function before(a, b)
  if a.score ~= b.score then return a.score < b.score end
  return a.key < b.key
end

-- The first tenant in queue order in the ready set of `shape` (a survey top), or nil;
-- with `after` (a top of this shape), the first one after it in queue order.
-- The set orders (stored score, head key). Without a half-life stored scores are
-- exact: the first member (after `after`) is the answer. With one they are lower
-- bounds (share_of), so the walk goes on while a stored (score, key) could still beat
-- the best current one. `check` (the shape is blocked, so a top may be held for):
-- members whose lane is empty are stale, skipped (dropped when `tidy`).
-- `scores` (optional): tenant -> {current score at `now`, its bound}, shared by the
-- walks of one plan (nothing it calls changes a tenant's usage), so a tenant waiting in
-- several ready sets is scored once.
-- With a half-life the members are read in batches that double (up to WALK_BATCH):
-- most walks stop after a member or two, a long one (every stored score stale, e.g.
-- scores written while the tenants' decayed usage was still 0) costs a read per batch
-- instead of per member. A stale member dropped on the way keeps the rank of the next.
local WALK_BATCH = 64
local function best_of(shape, D, now, tidy, check, after, scores)
  local key = P .. 'r:' .. shape
  local decay = halflife().accrues
  local best, rank = nil, 0
  -- with `tidy`, the bounds (share_of) computed on the way replace the stored ones once
  -- the walk is over, so the next walk starts from tighter bounds
  local fresh = {}
  local batch, at, size = {}, 1, decay and 2 or 1
  while true do
    if at > #batch then
      batch = redis.call('ZRANGE', key, rank, rank + size - 1, 'WITHSCORES')
      at = 1
      size = math.min(size * 2, WALK_BATCH)
    end
    if at > #batch then break end
    local member = batch[at]
    local top = {shape = shape, D = D, score = tonumber(batch[at + 1]), member = member}
    at = at + 2
    top.key, top.tenant = member_parts(member)
    if best and not before(top, best) then break end
    if check and redis.call('EXISTS', lane_key(top.tenant, shape)) == 0 then
      if tidy then drop_stale(top.tenant, shape, member) else rank = rank + 1 end
    else
      rank = rank + 1
      if decay then
        local stored = top.score
        local known = scores and scores[top.tenant]
        if not known then
          local st = usage_state(top.tenant)
          known = {share_of(top.tenant, st, now), share_of(top.tenant, st, now, 0, true)}
          if scores then scores[top.tenant] = known end
        end
        top.score = known[1]
        if tidy and known[2] > stored then
          fresh[#fresh + 1] = known[2]
          fresh[#fresh + 1] = member
        end
      end
      if after == nil or before(after, top) then
        if best == nil or before(top, best) then best = top end
        if not decay then return best end
      end
    end
  end
  for i = 1, #fresh, 2000 do  -- (unpack has a limit on how many values it returns)
    redis.call('ZADD', key, 'XX', unpack(fresh, i, math.min(i + 1999, #fresh)))
  end
  return best
end

-- The ready entries of a tier, one per shape (its first tenant in queue order), sorted
-- in queue order; each top: shape, tenant, score, key, D (parse_shape), blocked
-- (cap_check without holds). `tidy` (writing scripts only) forgets shapes whose ready
-- set is empty and stale tenants found on the way (others are skipped).
local function survey(tier, now, tidy, scores)
  local tops = {}
  for _, shape in ipairs(tier_shapes(tier)) do
    local D = parse_shape(shape)
    local blocked = cap_check(D, nil, false)
    local top = best_of(shape, D, now, tidy, blocked ~= nil, nil, scores)
    if top then
      top.blocked = blocked
      tops[#tops + 1] = top
    elseif tidy and redis.call('EXISTS', P .. 'r:' .. shape) == 0 then
      redis.call('SREM', P .. 'sh:' .. tier, shape)
    end
  end
  table.sort(tops, before)
  return tops
end

-- Whether the tenant of a top is below its weighted share of the cluster: slices in
-- use / weight < capacity slices / (summed weight of the tenants with a ready entry of
-- the tier). That share is at most the tenant's water-filled entitlement, so a tenant
-- at or above its entitlement is never below it.
-- `bw`: {tier = summed weight} read once per plan (nothing writes bw during one).
local function below_share(top, tier, bw)
  local capacity = cap_slices()
  if bw[tier] == nil then bw[tier] = tonumber(redis.call('HGET', P .. 'bw', tier) or '0') end
  local w = bw[tier]
  if w <= 0 then return false end
  if not halflife().accrues then
    -- with current usage only the top's score is slices in use / weight (refresh writes it
    -- at every change of either): it decides, unless the product's rounding could
    local margin = top.score * w - capacity
    if math.abs(margin) > 1e-9 * capacity then return margin < 0 end
  end
  -- only the usage fields: the whole state (lane heads, queue counters) is not needed
  local used = usage_slices(usage_state(top.tenant))
  return used * w < capacity * cfg_of(top.tenant).w
end

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
local function plan(tier, now, stop, counts, tidy)
  -- current scores by tenant, shared by this plan's walks (see best_of)
  local scores = {}
  local tops = survey(tier, now, tidy, scores)
  -- the entries in the walk ('<shape> <member>'): each is walked once
  local listed = {}
  local favoured_list, record = favoured_tops(tier, now)
  for _, favoured in ipairs(favoured_list) do
    for j, top in ipairs(tops) do
      if top.member == favoured.member and top.shape == favoured.shape then
        table.remove(tops, j)
        break
      end
    end
    local at = 1
    while at <= #tops and before(tops[at], favoured) do at = at + 1 end
    table.insert(tops, at, favoured)
  end
  for _, top in ipairs(tops) do listed[top.shape .. ' ' .. top.member] = true end
  local G = {i = {}, t = {}, b = {}}
  local held, bw = {}, {}
  local decay = halflife().accrues
  local i = 1
  while i <= #tops do
    local top = tops[i]
    if stop and not before(top, stop) then break end
    -- nothing held yet: the survey's check without holds is the answer
    local blocked = top.blocked
    if not blocked and #held > 0 then blocked = cap_check(top.D, G, false) end
    if not blocked or (not top.blocked and backfills(top, held, now)) then
      if not counts or shares_resource(top.D, counts) then return G, top, held, record end
    elseif cap_check(top.D, nil, true) == nil then
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
        local next_top = best_of(top.shape, top.D, now, false, true, top, scores)
        -- (the handover's entry, or the one the survey found, may come after its top)
        while next_top and listed[next_top.shape .. ' ' .. next_top.member] do
          next_top = best_of(top.shape, top.D, now, false, true, next_top, scores)
        end
        if next_top then
          listed[next_top.shape .. ' ' .. next_top.member] = true
          next_top.blocked = top.blocked
          local at = i + 1
          while at <= #tops and before(tops[at], next_top) do at = at + 1 end
          table.insert(tops, at, next_top)
        end
      end
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
-- already, else {'capacity', res, units missing}, {'guard', res, tenant it is held
-- for}; nil when it fits.
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
  if c then return {'capacity', c[1], c[2]} end
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
