-- bind: the validating webhook sees a pod CREATE presenting ticket ARGV[1], with uid
-- ARGV[2], namespace ARGV[3] and the pod's final name ARGV[4], before the pod is stored;
-- ARGV[5] = 1: dry run (write nothing). The first uid to present an unclaimed ticket
-- claims it (F_CLAIM), and a name admitted as `<prefix>*` becomes the pod's own; the
-- reservation still expires unless the dispatcher then sees that pod (confirm), since a
-- later admission step may refuse it. Returns {1} (claimed by this uid, now or before),
-- {0} (unknown ticket) or {-1, namespace, name} (another pod owns it: refuse this one).
local ticket, uid, ns, name, dry = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5] == '1'
local rec = get_rec(ticket)
if not rec then return {0} end
local owner = owner_of(rec)
if owner ~= '' then
  if owner == uid then return {1} end
  return {-1, rec[F_NS], rec[F_NAME]}
end
if rec[F_NS] ~= ns or not name_fits(rec[F_NAME], name) then
  return {-1, rec[F_NS], rec[F_NAME]}
end
if dry then return {1} end
take_name(ticket, rec, name)
for i = #rec + 1, F_UID do rec[i] = '' end
rec[F_CLAIM] = uid
put_rec(ticket, rec)
return {1}
