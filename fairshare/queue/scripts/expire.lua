-- expire: forget tickets admitted at or before ARGV[1] whose pod was never seen: fast-path
-- reservations, and queue entries of pods that never came to exist (a later admission
-- step refused the pod). ARGV[2] (optional): now, for decayed usage. Returns the
-- expired tickets, by the time they expired after, then by ticket (bytes).
NOW = tonumber(ARGV[2] or '')
local cutoff = ARGV[1]

-- whether ticket a sorts before ticket b byte by byte (as Redis orders members)
local function bytes_before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- {time, ticket} of every unseen ticket due, from the buckets whose lower bound is due
local due = {}
local buckets = redis.call('ZRANGEBYSCORE', K_UNSEEN, '-inf', cutoff)
for _, b in ipairs(buckets) do
  local flat = redis.call('ZRANGEBYSCORE', K_UNSEEN .. ':' .. b, '-inf', cutoff,
                          'WITHSCORES')
  for i = 1, #flat, 2 do
    due[#due + 1] = {tonumber(flat[i + 1]), unpack_entry(flat[i])}
  end
end
-- a Redis written before buckets: its `resv` entry is still due unless the ticket was
-- forgotten, seen or given a new time (in a bucket) since
local legacy = redis.call('ZRANGEBYSCORE', K_RESV, '-inf', cutoff, 'WITHSCORES')
for i = 1, #legacy, 2 do
  local ticket = legacy[i]
  redis.call('ZREM', K_RESV, ticket)
  local rec = get_rec(ticket)
  if rec and uid_of(rec) == '' and not resv_score(ticket) then
    due[#due + 1] = {tonumber(legacy[i + 1]), ticket}
  end
end
table.sort(due, function(x, y)
  if x[1] ~= y[1] then return x[1] < y[1] end
  return bytes_before(x[2], y[2])
end)

local out = {}
for _, item in ipairs(due) do
  local ticket = item[2]
  local rec = get_rec(ticket)
  if rec then
    forget(ticket, rec)
  else
    resv_remove(ticket)
  end
  out[#out + 1] = ticket
end
-- the buckets read: their index score is their lowest score again
for _, b in ipairs(buckets) do
  local first = redis.call('ZRANGE', K_UNSEEN .. ':' .. b, 0, 0, 'WITHSCORES')
  if first[2] then
    redis.call('ZADD', K_UNSEEN, first[2], b)
  else
    redis.call('ZREM', K_UNSEEN, b)
  end
end
return out
