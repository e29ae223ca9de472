-- POST a real AdmissionReview v1 per request, each with a fresh request uid.
--
-- Usage: wrk -s bench/wrk/review.lua URL -- TEMPLATE RATE RUN_TAG THREADS [GANG_SIZE]
--   TEMPLATE  a JSON file holding one AdmissionReview whose uid is UID_PLACEHOLDER
--             (the placeholder may occur more than once, e.g. in the ticket annotation)
--             and where GANG_PLACEHOLDER, if present, is a gang name
--   RATE      target requests/s over all threads, or 0 for saturation (closed loop)
--   RUN_TAG   8 hex digits making the uids of this run unique across runs
--   THREADS   wrk's -t (to split RATE between threads)
--   GANG_SIZE requests per gang name (default 1): each thread's requests 1..N name one
--             fresh gang, N+1..2N the next, so every gang gets exactly N members
--
-- Fixed rate (Debian has no wrk2): each thread hands out send slots on an absolute
-- schedule (slot k at start + k * threads / RATE) and delay() waits for the next slot,
-- so a slow answer does not slow the schedule down as long as a connection is free.
-- The latency wrk records is send -> answer of each request (no queueing before send);
-- the achieved rate is reported so a missed schedule shows.
--
-- done() prints one JSON line prefixed by "WRK_JSON " with latency percentiles in
-- microseconds, counts, error counts and how many answers carried each decision.

local ffi = require("ffi")
ffi.cdef [[
  typedef struct { long tv_sec; long tv_nsec; } fairgate_timespec;
  int clock_gettime(int clk_id, fairgate_timespec *tp);
]]
local CLOCK_MONOTONIC = 1
local ts = ffi.new("fairgate_timespec")

local function now_ms()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end

local threads = {}
local thread_count = 0

function setup(thread)
  thread_count = thread_count + 1
  thread:set("thread_id", thread_count)
  table.insert(threads, thread)
end

local parts = {}
local holes = {}  -- holes[k]: what goes between parts[k] and parts[k + 1], "uid" or "gang"
local gang_size = 1
local has_gang = false
local rate, interval, next_slot = 0, 0, nil
local counter = 0
local tag = "00000000"
decisions = {admit = 0, queue = 0, deny = 0, other = 0}  -- global: done() reads it per thread

function init(args)
  local file = assert(io.open(args[1], "rb"), "cannot open template " .. tostring(args[1]))
  local template = file:read("*a")
  file:close()
  local start = 1
  while true do
    local i, j = string.find(template, "UID_PLACEHOLDER", start, true)
    local gi, gj = string.find(template, "GANG_PLACEHOLDER", start, true)
    local kind = "uid"
    if gi and (not i or gi < i) then
      i, j, kind = gi, gj, "gang"
    end
    if not i then
      parts[#parts + 1] = string.sub(template, start)
      break
    end
    parts[#parts + 1] = string.sub(template, start, i - 1)
    holes[#holes + 1] = kind
    has_gang = has_gang or kind == "gang"
    start = j + 1
  end
  assert(#parts >= 2, "template has no UID_PLACEHOLDER")
  gang_size = tonumber(args[5] or "1")
  rate = tonumber(args[2] or "0")
  tag = args[3] or tag
  if rate > 0 then
    -- args[4] is the thread count: the threads share the rate equally.
    local per_thread = rate / (tonumber(args[4] or "1"))
    interval = 1000 / per_thread
  end
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  counter = counter + 1
  local uid = string.format("%s-%04x-4000-8000-%012x", tag, thread_id or 0, counter)
  if not has_gang then
    return wrk.format(nil, nil, nil, table.concat(parts, uid))
  end
  local gang = string.format("g%s-%04x-%x", tag, thread_id or 0,
                             math.floor((counter - 1) / gang_size))
  local out = {}
  for k, kind in ipairs(holes) do
    out[#out + 1] = parts[k]
    out[#out + 1] = kind == "gang" and gang or uid
  end
  out[#out + 1] = parts[#parts]
  return wrk.format(nil, nil, nil, table.concat(out))
end

function delay()
  if interval == 0 then
    return 0
  end
  local now = now_ms()
  if next_slot == nil then
    next_slot = now
  end
  next_slot = next_slot + interval
  local wait = next_slot - now
  if wait < 0 then
    return 0
  end
  return wait
end

function response(status, headers, body)
  if status ~= 200 then
    return
  end
  if string.find(body, '"decision":"admit"', 1, true) then
    decisions.admit = decisions.admit + 1
  elseif string.find(body, '"decision":"queue"', 1, true) then
    decisions.queue = decisions.queue + 1
  elseif string.find(body, '"allowed":false', 1, true) then
    decisions.deny = decisions.deny + 1
  else
    decisions.other = decisions.other + 1
  end
end

function done(summary, latency, requests)
  local totals = {admit = 0, queue = 0, deny = 0, other = 0}
  for _, thread in ipairs(threads) do
    local d = thread:get("decisions")
    for k, v in pairs(d) do
      totals[k] = totals[k] + v
    end
  end
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"duration_us":%d,"requests":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"p50":%d,"p90":%d,"p99":%d,"p99.9":%d,"max":%d,"mean":%.1f},' ..
    '"decisions":{"admit":%d,"queue":%d,"deny":%d,"other":%d}}\n',
    summary.duration, summary.requests, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max, latency.mean,
    totals.admit, totals.queue, totals.deny, totals.other))
end
