-- expire: forget tickets admitted at or before ARGV[1] whose pod was never seen: fast-path
-- reservations, and queue entries of pods that never came to exist (a later admission
-- step refused the pod). ARGV[2] (optional): now, for decayed usage. Returns the
-- expired tickets.
NOW = tonumber(ARGV[2] or '')
local out = {}
for _, ticket in ipairs(redis.call('ZRANGEBYSCORE', K_RESV, '-inf', ARGV[1])) do
  local rec = get_rec(ticket)
  if rec then
    forget(ticket, rec)
  else
    redis.call('ZREM', K_RESV, ticket)
  end
  out[#out + 1] = ticket
end
return out
