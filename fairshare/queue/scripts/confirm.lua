-- confirm: the dispatcher (or a rebuild) sees the pod of ticket ARGV[1]: uid ARGV[2],
-- namespace ARGV[3], name ARGV[4]. The first pod seen with a ticket owns it: the
-- ticket is bound to its uid, a reservation no longer expires, a queued entry now
-- counts as queued demand, and a name admitted as `<prefix>*` becomes the pod's own
-- name (the API server's: the prefix, already cut to 58 characters by the webhook, plus
-- exactly 5 generated ones). Returns 1 (confirmed), 0 (unknown ticket) or -1 (the
-- ticket belongs to another pod: a different uid, namespace or name presents it, or
-- another uid claimed it at validation; nothing changes).
local ticket, uid, ns, name = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local rec = get_rec(ticket)
if not rec then return 0 end
local bound = uid_of(rec)
if bound ~= '' then
  return bound == uid and 1 or -1
end
local claim = rec[F_CLAIM] or ''
if (claim ~= '' and claim ~= uid) or rec[F_NS] ~= ns or not name_fits(rec[F_NAME], name) then
  return -1
end
resv_remove(ticket)
take_name(ticket, rec, name)
rec[F_UID] = uid
if rec[F_STATE] == 'R' then rec[F_STATE] = 'A' end
if rec[F_STATE] == 'Q' or rec[F_STATE] == 'G' then
  bump_state(rec[F_TENANT], seen_demand_deltas(rec, 1, {}))
end
put_rec(ticket, rec)
return 1
