-- unsized: the ids of the gangs waiting for their size (stored size
-- fairshare.queue.model.UNKNOWN_GANG_SIZE: queued before the object giving it was seen).
local UNKNOWN = '1000000'
local found = {}
for _, gid in ipairs(redis.call('SMEMBERS', K_GANGS)) do
  if redis.call('HGET', P .. 'g:' .. gid, 'n') == UNKNOWN then found[#found + 1] = gid end
end
return found
