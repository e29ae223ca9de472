-- forget: a pod ended or was deleted. ARGV: ticket, mode ('any' | 'queued': only a
-- queued ticket | 'reclaimed': any, and the pod was evicted by reclaim: see forget in
-- lib_lanes.lua), the pod's uid, now (optional: decayed usage is folded up to it). A
-- ticket bound to another pod's uid is not this pod's to free (a twin carrying a
-- copied ticket): nothing changes. Returns 1 when something was freed.
local ticket, mode, uid = ARGV[1], ARGV[2], ARGV[3]
NOW = tonumber(ARGV[4] or '')
local rec = get_rec(ticket)
if not rec then return 0 end
if mode == 'queued' and rec[F_STATE] ~= 'Q' and rec[F_STATE] ~= 'G' then return 0 end
local bound = uid_of(rec)
if bound ~= '' and bound ~= uid then return 0 end
forget(ticket, rec, mode == 'reclaimed')
return 1
