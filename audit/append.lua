-- Append one audit record to the chain if the chain head is still what the writer saw.
-- KEYS[1] the stream, KEYS[2] the chain head (hash: seq, hash, floor)
-- ARGV[1] the head hash the record chains to ("" when the chain is empty)
-- ARGV[2] the record's seq, ARGV[3] its hash, ARGV[4] its JSON, ARGV[5] maxlen (exact)
-- Returns {1, stream id} when appended, or {0, head seq, head hash} when another writer
-- moved the head first (the caller re-chains the record onto that head and retries).
local head = redis.call('HMGET', KEYS[2], 'seq', 'hash', 'floor')
local head_hash = head[2] or ''
if head_hash ~= ARGV[1] then
  return {0, head[1] or '0', head_hash}
end
local seq = tonumber(ARGV[2])
local maxlen = tonumber(ARGV[5])
local floor = math.max(tonumber(head[3] or '1'), seq - maxlen + 1, 1)
local id = redis.call('XADD', KEYS[1], 'MAXLEN', maxlen, '*', 'record', ARGV[4])
redis.call('HSET', KEYS[2], 'seq', seq, 'hash', ARGV[3], 'floor', floor)
return {1, id}
