-- resize: gangs whose size was not known when their members were queued learn it.
-- ARGV: gang id, size, gang id, size, ... A gang whose stored size is not the unknown
-- size (fairshare.queue.model.UNKNOWN_GANG_SIZE) is left as it is; one that is takes
-- the size and joins its lane once running + queued members reach it. Returns the
-- number of gangs resized.
local UNKNOWN = '1000000'
local resized = 0
for i = 1, #ARGV, 2 do
  local gid, size = ARGV[i], ARGV[i + 1]
  local key = P .. 'g:' .. gid
  if redis.call('HGET', key, 'n') == UNKNOWN then
    redis.call('HSET', key, 'n', size)
    gang_link(gid, false)
    refresh(redis.call('HGET', key, 't'))
    resized = resized + 1
  end
end
return resized
