-- priced_for: the live admissions priced for one object (see note_priced). ARGV: the
-- object (`<namespace>/<c|t>/<name>`). Returns, per live ticket, ticket, counts, state,
-- namespace and pod name (from its record), flat; the fields of tickets no longer live
-- are dropped (the key goes with its last field).
local key = P .. 'po:' .. ARGV[1]
local raw = redis.call('HGETALL', key)
local out = {}
for i = 1, #raw, 2 do
  local rec = get_rec(raw[i])
  if rec then
    out[#out + 1] = raw[i]
    out[#out + 1] = raw[i + 1]
    out[#out + 1] = rec[F_STATE]
    out[#out + 1] = rec[F_NS]
    out[#out + 1] = rec[F_NAME]
  else
    redis.call('HDEL', key, raw[i])
  end
end
return out
