-- find: the ticket of the pod named ARGV[2] in namespace ARGV[1] (as admitted: a
-- generateName pod is `<generateName>*` until a rebuild lists it), or '' if none.
local key, field = name_slot(ARGV[1], ARGV[2])
local packed = redis.call('HGET', key, field)
if not packed then return '' end
local ticket = unpack_ticket(packed)
local rec = get_rec(ticket)
if not rec or rec[F_NS] ~= ARGV[1] or rec[F_NAME] ~= ARGV[2] then return '' end
return ticket
