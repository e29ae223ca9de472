-- note_priced: what an admitted pod's ResourceClaims and ResourceClaimTemplates were
-- priced at. ARGV: ticket, lifetime (seconds), then pairs of object
-- (`<namespace>/<c|t>/<name>`: c a claim, t a template) and its counts ('gpu=1'; ''
-- for none). Nothing is written unless the ticket is live (its record is in tk).
-- Each object is the hash po:<object>, ticket -> counts; a field of a ticket no longer
-- live is dropped here (and by priced_for); every write sets the key's lifetime.
-- Returns how many objects were noted.
local ticket, lifetime = ARGV[1], tonumber(ARGV[2])
if not get_rec(ticket) then return 0 end
local noted = 0
for i = 3, #ARGV - 1, 2 do
  local key = P .. 'po:' .. ARGV[i]
  for _, other in ipairs(redis.call('HKEYS', key)) do
    if other ~= ticket and redis.call('HEXISTS', K_TICKETS, other) == 0 then
      redis.call('HDEL', key, other)
    end
  end
  redis.call('HSET', key, ticket, ARGV[i + 1])
  redis.call('EXPIRE', key, lifetime)
  noted = noted + 1
end
return noted
