-- Shared helpers of the fair queue, part base. The helpers are split by concern into
-- lib_<part>.lua files, joined in the order of fairshare/queue/calls.py LIB_PARTS (each
-- part uses the locals of the parts before it). The operations (<op>.lua) run on top of
-- them, all in one Redis Function library (library.lua: the helpers run once per key
-- prefix, KEYS[1]). Key layout, rules and the library: fairshare/queue/README.md.
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
-- the slices of inferenceReserve that no inference pod of their tenant uses, summed over
-- the tenants: capacity no borrowed pod may take (cap_check)
local K_IDLE_RESERVE = P .. 'ri'
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
