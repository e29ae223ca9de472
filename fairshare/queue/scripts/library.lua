#!lua name=--[[library]]
-- fairgate's fair queue as one Redis Function library (Redis >= 7.0), assembled by
-- fairshare/queue/calls.py (library()) from this frame, the shared helpers
-- (lib_<part>.lua, joined in the order of LIB_PARTS) and the operation files
-- (<op>.lua): the markers --[[...]] are replaced, nothing else is.
--
-- The helpers were written to run once per call (EVALSHA ran them before every
-- operation); here they run once per key prefix (KEYS[1]) for the life of the library:
-- `instance` is the helpers plus the operations as closures over their locals, made on
-- the first call with a prefix and kept. What the helpers keep during one operation
-- (their per-call caches and the clock) is cleared by `begin` before every operation,
-- so an operation sees what it saw as a script. A top-level local of the helpers that
-- an operation assigns or fills must be cleared in `begin`
-- (tests/fairshare/queue/test_library.py checks it).

local function instance(KEYS)
--[[lib]]

-- SHAPES (parse_shape's cache) is the one cache kept between calls: a parsed shape
-- depends on the shape's text alone, and is only read. It is emptied every
-- SHAPE_CALLS calls, so shapes no longer used do not pile up.
local SHAPE_CALLS, calls = 1000, 0
local function begin()
  CFG, USED, CAP, DU, BUCKETS = {}, {}, {}, {}, {}
  NOW, HL, RUN, CAP_SLICES, TOTAL_WEIGHT = nil, nil, nil, nil, nil
  IDLE = {}
  PACK_IN, PACK_OUT = nil, nil
  calls = calls + 1
  if calls >= SHAPE_CALLS then SHAPES, calls = {}, 0 end
end

local ops = {}
--[[operations]]
return ops
end

-- instances by key prefix; more prefixes than this drops them all (one Redis normally
-- serves one fairgate, i.e. one prefix; tests use a few)
local MAX_INSTANCES = 16
local instances, count = {}, 0

local function run(name, keys, args)
  local prefix = keys[1]
  if type(prefix) ~= 'string' then
    return redis.error_reply('invalid: ' .. name .. ' needs the key prefix as its one key')
  end
  local ops = instances[prefix]
  if not ops then
    if count >= MAX_INSTANCES then instances, count = {}, 0 end
    ops = instance(keys)
    instances[prefix], count = ops, count + 1
  end
  return ops[name](args)
end

local function register(name, flags)
  redis.register_function{
    function_name = '--[[library]]_' .. name,
    callback = function(keys, args) return run(name, keys, args) end,
    flags = flags,
  }
end

--[[registrations]]
