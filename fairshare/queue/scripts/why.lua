-- why: ARGV: ticket, now. Returns the ticket record's 12 fields,
-- then position (0 if none), queue length and, for a queued ticket, the reason.
local ticket, now = ARGV[1], tonumber(ARGV[2])
local rec = get_rec(ticket)
if not rec then return {} end
local out = {}
for i = 1, F_AT do out[i] = rec[i] end
if rec[F_STATE] == 'Q' or rec[F_STATE] == 'G' then
  for _, v in ipairs(describe_queued(ticket, rec, now)) do out[#out + 1] = v end
else
  out[#out + 1] = 0
  out[#out + 1] = num(state_of(rec[F_TENANT]), 'qc:' .. rec[F_CLASS])
end
return out
