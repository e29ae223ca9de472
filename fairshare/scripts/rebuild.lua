-- rebuild: replace usage and queue with the cluster's truth; configuration stays.
-- ARGV: records of 11 fields: kind ('A' running | 'Q' gated, gated in queue order),
-- ticket, tenant, namespace, name, class, band, demand, gang id, gang size, submitted.
for _, tenant in ipairs(redis.call('SMEMBERS', K_TENANTS)) do
  for _, shape in ipairs(redis.call('SMEMBERS', P .. 'tl:' .. tenant)) do
    redis.call('DEL', lane_key(tenant, shape))
  end
  redis.call('DEL', P .. 'tl:' .. tenant, P .. 'ts:' .. tenant)
  if redis.call('EXISTS', P .. 'tc:' .. tenant) == 0 then
    redis.call('SREM', K_TENANTS, tenant)
  end
end
for _, tier in ipairs(TIERS) do
  for _, shape in ipairs(tier_shapes(tier)) do redis.call('DEL', P .. 'r:' .. shape) end
  redis.call('DEL', P .. 'sh:' .. tier)
end
for _, gid in ipairs(redis.call('SMEMBERS', K_GANGS)) do redis.call('DEL', P .. 'g:' .. gid) end
redis.call('DEL', K_GANGS, K_TICKETS, K_RESV, K_USED)
USED = nil

local seq = 0
for i = 1, #ARGV, 11 do
  local kind, ticket, tenant, ns, name, cls, band, demand, gid, gsize, submitted =
    unpack(ARGV, i, i + 10)
  if not get_rec(ticket) then
    redis.call('SADD', K_TENANTS, tenant)
    seq = seq + 1
    local rec = {kind, tenant, cls, band, demand, ns, name, gid, gsize, submitted, seq, ''}
    if kind == 'A' then
      put_rec(ticket, rec)
      add_usage(tenant, band, parse_counts(demand), 1)
      if gid ~= '' then
        local key = P .. 'g:' .. gid
        redis.call('HSET', key, 't', tenant, 'c', cls, 'n', gsize)
        redis.call('HINCRBY', key, 'r', 1)
        redis.call('SADD', K_GANGS, gid)
      end
    else
      enqueue(ticket, rec, false)
    end
  end
end
redis.call('SET', K_SEQ, seq)
redis.call('SET', K_REBUILT, 1)
for _, tenant in ipairs(redis.call('SMEMBERS', K_TENANTS)) do refresh(tenant) end
return 1
