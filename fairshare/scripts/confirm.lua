-- confirm: the pod of ticket ARGV[1] exists; its reservation no longer expires.
-- Returns 1 when the ticket is known.
local ticket = ARGV[1]
local rec = get_rec(ticket)
if not rec then return 0 end
redis.call('ZREM', K_RESV, ticket)
if rec[F_STATE] == 'R' then
  rec[F_STATE] = 'A'
  put_rec(ticket, rec)
end
return 1
