-- requeue: a released (or reserved) ticket could not start; free its usage and queue
-- it at the head of its lane. A gang member is retried alone. Returns 1 if requeued.
-- ARGV: ticket, now (optional: decayed usage is folded up to it).
local ticket = ARGV[1]
NOW = tonumber(ARGV[2] or '')
local rec = get_rec(ticket)
if not rec or (rec[F_STATE] ~= 'R' and rec[F_STATE] ~= 'A') then return 0 end
add_usage(rec[F_TENANT], rec[F_BAND], parse_counts(rec[F_DEMAND]), -1, nil,
          tonumber(rec[F_AT]))
note_running(ticket, rec[F_TENANT], parse_counts(rec[F_DEMAND]), -1)
-- a ticket whose pod was never seen keeps expiring (see expire)
if uid_of(rec) ~= '' then resv_remove(ticket) end
local changed = gang_running(rec[F_GANG], -1)
rec[F_GANG] = ''
rec[F_GSIZE] = '1'
rec[F_AT] = ''
enqueue(ticket, rec, true)
refresh_both(rec[F_TENANT], changed)
return 1
