-- forget: a pod ended or was deleted. ARGV: ticket, mode ('any' | 'queued': only a
-- queued ticket), now (optional: decayed usage is folded up to it). Returns 1 when
-- something was freed.
local ticket, mode = ARGV[1], ARGV[2]
NOW = tonumber(ARGV[3] or '')
local rec = get_rec(ticket)
if not rec then return 0 end
if mode == 'queued' and rec[F_STATE] ~= 'Q' and rec[F_STATE] ~= 'G' then return 0 end
forget(ticket, rec)
return 1
