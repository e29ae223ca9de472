-- rebuild: replace usage and queue with the cluster's truth; configuration stays.
-- ARGV[1]: cutoff ('' keeps nothing): reserved or released tickets (state R or A with
-- a reservation/release time F_AT) later than the cutoff are in flight, made after
-- the pods were listed or too recently for the list to show them; they are kept with
-- their usage (and reservation expiry), before the list is applied.
-- ARGV[2]: n, then ARGV[3 .. 2 + n]: the tickets of riders (listed pods charged nothing:
-- their GPUs are a shared claim another listed pod pays), never kept, in flight or not.
-- ARGV[3 + n ..]: records of 14 fields: kind ('A' running | 'Q' gated, gated in queue
-- order), ticket, tenant, namespace, name, class, band, demand, gang id, gang size,
-- submitted, pod uid (the listed pods are seen: their tickets are bound to them), when
-- a running pod's run began ('' unknown; used when Redis no longer knows it), its
-- declared run time in seconds ('' none; F_RUN). A
-- listed ticket that is kept stays as it is (a listed running pod confirms a kept
-- reservation, and binds it to its uid when it was unseen).
-- A listed running pod whose ticket was held before keeps its reservation/release time
-- (when its run began: the expected run time learns from it when it ends).
local cutoff = tonumber(ARGV[1])
local riders = {}
local first_record = 3 + tonumber(ARGV[2])
for i = 3, first_record - 1 do riders[ARGV[i]] = true end
local kept, began = {}, {}
local flat = redis.call('HGETALL', K_TICKETS)
for i = 1, #flat, 2 do
  local rec = split(flat[i + 1], SEP)
  if (rec[F_STATE] == 'R' or rec[F_STATE] == 'A') and rec[F_AT] ~= '' then
    if cutoff and tonumber(rec[F_AT]) > cutoff then
      if not riders[flat[i]] then kept[#kept + 1] = {flat[i], rec} end
    else
      began[flat[i]] = rec[F_AT]
    end
  end
end
table.sort(kept, function(a, b) return tonumber(a[2][F_SEQ]) < tonumber(b[2][F_SEQ]) end)

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
-- a gang's words (src, aw: where it was declared) are not in the pods' records: the
-- gangs rebuilt from the lists keep the ones stored before
local words = {}
for _, gid in ipairs(redis.call('SMEMBERS', K_GANGS)) do
  local src, aw = unpack(redis.call('HMGET', P .. 'g:' .. gid, 'src', 'aw'))
  if src then words[gid] = {src, aw or ''} end
  redis.call('DEL', P .. 'g:' .. gid)
end
-- expected ends (re:<capacity key>) of every key in use or in the capacity
local in_use = {}
for _, field in ipairs(redis.call('HKEYS', K_USED)) do in_use[field:sub(3)] = true end
for _, key in ipairs(redis.call('HKEYS', K_CAP)) do in_use[key] = true end
for key, _ in pairs(in_use) do redis.call('DEL', P .. 're:' .. key) end
redis.call('DEL', K_GANGS, K_TICKETS, K_USED, P .. 'bw', P .. 'bm', K_CHARGED)
resv_clear()
buckets_clear('nm')
USED, IDLE = {}, {}

-- a ticket holding usage (state R or A)
local function hold(ticket, rec)
  redis.call('SADD', K_TENANTS, rec[F_TENANT])
  put_rec(ticket, rec)
  index_name(ticket, rec)
  add_usage(rec[F_TENANT], rec[F_BAND], parse_counts(rec[F_DEMAND]), 1, nil,
            tonumber(rec[F_AT]))
  note_running(ticket, rec[F_TENANT], parse_counts(rec[F_DEMAND]), 1, tonumber(rec[F_AT]),
               declared_run(rec))
  if uid_of(rec) == '' then resv_add(ticket, rec[F_AT]) end
  local gid = rec[F_GANG]
  if gid ~= '' then
    local key = P .. 'g:' .. gid
    -- the gang keeps the tenant it was created with (see enqueue)
    redis.call('HSETNX', key, 't', rec[F_TENANT])
    redis.call('HSETNX', key, 'bd', rec[F_BAND])
    redis.call('HSET', key, 'c', rec[F_CLASS], 'n', rec[F_GSIZE])
    redis.call('HINCRBY', key, 'r', 1)
    redis.call('SADD', K_GANGS, gid)
  end
end

local seq = 0
for _, item in ipairs(kept) do
  seq = seq + 1
  item[2][F_SEQ] = seq
  hold(item[1], item[2])
end
for i = first_record, #ARGV, 14 do
  local kind, ticket, tenant, ns, name, cls, band, demand, gid, gsize, submitted, uid, start,
    run = unpack(ARGV, i, i + 13)
  local rec = get_rec(ticket)
  if not rec then
    seq = seq + 1
    rec = with_run({kind, tenant, cls, band, demand, ns, name, gid, gsize, submitted, seq,
                    kind == 'A' and (began[ticket] or start) or '', uid}, run)
    if kind == 'A' then
      hold(ticket, rec)
    else
      redis.call('SADD', K_TENANTS, tenant)
      enqueue(ticket, rec, false)
      index_name(ticket, rec)
    end
  elseif kind == 'A' and uid_of(rec) == '' then
    resv_remove(ticket)
    unindex_name(ticket, rec)
    rec[F_STATE] = 'A'
    rec[F_NAME] = name
    rec[F_UID] = uid
    put_rec(ticket, rec)
    index_name(ticket, rec)
  end
end
for gid, said in pairs(words) do
  if redis.call('SISMEMBER', K_GANGS, gid) == 1 then
    redis.call('HSET', P .. 'g:' .. gid, 'src', said[1], 'aw', said[2])
  end
end
redis.call('SET', K_SEQ, seq)
redis.call('SET', K_REBUILT, 1)
count_idle_reserve()
for _, tenant in ipairs(redis.call('SMEMBERS', K_TENANTS)) do refresh(tenant) end
return 1
