-- The fair queue's library, part lanes: lanes, readiness and gangs.
-- Runs after the parts before it (fairshare/queue/calls.py LIB_PARTS), as one file.

-- lanes and readiness ------------------------------------------------------------

-- bw: tier -> summed weight of the tenants with a ready lane of that tier; bm:
-- '<tier>:<tenant>' -> '1' for those tenants (the weighted-share test of survey); the
-- tenant's state keeps the same tiers as `bt` (e.g. 'tb'), so an unchanged set costs
-- no read of bm. sync deletes bw, bm and every `bt`, rebuild bw, bm and the states;
-- both refresh every tenant, which sets them again. `st`: the tenant's state, kept
-- current.
local function mark_backlogged(tenant, w, tiers, st)
  local now = ''
  for _, tier in ipairs(TIERS) do
    if tiers[tier] then now = now .. tier end
  end
  if (st.bt or '') == now then return end
  local fields = {}
  for i, tier in ipairs(TIERS) do fields[i] = tier .. ':' .. tenant end
  local was = redis.call('HMGET', P .. 'bm', unpack(fields))
  for i, tier in ipairs(TIERS) do
    if tiers[tier] and not was[i] then
      redis.call('HSET', P .. 'bm', fields[i], '1')
      redis.call('HINCRBYFLOAT', P .. 'bw', tier, w)
    elseif was[i] and not tiers[tier] then
      redis.call('HDEL', P .. 'bm', fields[i])
      redis.call('HINCRBYFLOAT', P .. 'bw', tier, -w)
    end
  end
  if now == '' then
    redis.call('HDEL', P .. 'ts:' .. tenant, 'bt')
    st.bt = nil
  else
    redis.call('HSET', P .. 'ts:' .. tenant, 'bt', now)
    st.bt = now
  end
end

-- rq: with virtual time, the tenants charged the cluster's expected run time rt (slices
-- in use, none of their pods ended) that have a ready lane, scored by the mean start
-- time of their running slices (rb / slices in use): their ready-set scores depend on rt
-- while their charge lasts, i.e. until that mean is rt old, and are written again when
-- rt falls (rescore_charged). `rq` in the tenant's state holds its score there, so an
-- unchanged one costs no write. sync and rebuild refresh every tenant, which sets both
-- again (rebuild deletes rq with the states).
local K_CHARGED = P .. 'rq'
local function mark_charged(tenant, st, ready)
  local mean = nil
  if ready and halflife().virtual and usage_slices(st) > 0 and not du_of(tenant).r then
    mean = num(st, 'rb') / usage_slices(st)
  end
  if mean == (st.rq and tonumber(st.rq)) then return end
  if mean then
    redis.call('ZADD', K_CHARGED, mean, tenant)
    redis.call('HSET', P .. 'ts:' .. tenant, 'rq', mean)
  else
    redis.call('ZREM', K_CHARGED, tenant)
    redis.call('HDEL', P .. 'ts:' .. tenant, 'rq')
  end
  st.rq = mean
end

-- a gang's queued members (g: its g:<gid> hash), in arrival order
local function gang_members(g)
  if (g.m or '') == '' then return {} end
  return split(g.m, ',')
end

-- seq and submitted time of a lane entry, as stored (pack_entry) or not (a gang: its
-- newest member)
local function entry_info(entry)
  if string.sub(entry, 1, 1) ~= '@' then
    local rec = get_rec(unpack_entry(entry))
    return tonumber(rec[F_SEQ]), tonumber(rec[F_SUBMITTED])
  end
  local seq, at = 0, 0
  for _, ticket in ipairs(gang_members(hash_table(P .. 'g:' .. string.sub(entry, 2)))) do
    local rec = get_rec(ticket)
    seq = math.max(seq, tonumber(rec[F_SEQ]))
    at = math.max(at, tonumber(rec[F_SUBMITTED]))
  end
  return seq, at
end

-- Ready-set members order ties of the score themselves: a member is head_key(at, seq)
-- of the lane's head entry, a space and the tenant name, so the first member of equal
-- scores is the head created first (then admitted first). head_key: 32 hex digits,
-- two doubles encoded so that string order is numeric order (sign bit flipped for
-- x >= 0, every bit for x < 0).
local HEAD_KEY_LEN = 32
local function sortable(x)
  if x == 0 then x = 0 end  -- -0 sorts as 0
  local b = {string.byte(struct.pack('>d', x), 1, 8)}
  if x < 0 then
    for i = 1, 8 do b[i] = 255 - b[i] end
  else
    b[1] = b[1] + 128
  end
  return string.format('%02x%02x%02x%02x%02x%02x%02x%02x', unpack(b))
end

local function head_key(at, seq)
  return sortable(at) .. sortable(seq)
end

-- the ready-set member of a tenant's lane: its head key, a space (no tenant name, a
-- label value, has one), the tenant
local function ready_member(rk, tenant)
  return string.sub(rk, 1, HEAD_KEY_LEN) .. ' ' .. tenant
end

-- head key and tenant of a ready-set member; a member written before members carried
-- the head key is the bare tenant name (key '': first among equal scores)
local function member_parts(member)
  if string.sub(member, HEAD_KEY_LEN + 1, HEAD_KEY_LEN + 1) ~= ' ' then return '', member end
  return string.sub(member, 1, HEAD_KEY_LEN), string.sub(member, HEAD_KEY_LEN + 2)
end

-- Put each of the tenant's lanes into the ready set of its shape (score = share_of,
-- member = ready_member) when its head fits the tenant's quota, else take it out;
-- drop empty lanes. The member in the set is remembered in
-- the tenant's state (`rk:<shape>`: head_key .. head entry as the lane holds it, 49
-- bytes for a uuid ticket, so the state stays a small listpack hash; the head key of a
-- single pod entry never changes, so an unchanged head is not read again).
-- `st`: the tenant's state if the caller holds it current (else read); kept current.
-- `moved`: nil when any of the tenant's lanes may have changed since its last refresh;
-- else the set {shape = true} of the lanes that may have (pushed, popped, removed
-- from): the head of any other lane with a remembered member is that member's entry,
-- and is not read. NO_LANE: none did.
local NO_LANE = {}
local function refresh(tenant, st, moved)
  local cfg = cfg_of(tenant)
  st = st or state_of(tenant)
  local lanes_key = P .. 'tl:' .. tenant
  local lanes = redis.call('SMEMBERS', lanes_key)
  -- each lane's head (true: the remembered member's entry, not read); the tenant is
  -- active by the lanes left once the emptied ones are dropped
  local heads, live = {}, 0
  for i, shape in ipairs(lanes) do
    local known = st['rk:' .. shape] and moved and not moved[shape]
    heads[i] = known or redis.call('LINDEX', lane_key(tenant, shape), 0)
    if heads[i] then live = live + 1 end
  end
  track_active(tenant, st, live)
  local share = share_of(tenant, st, nil, 0, true)
  local tiers = {}
  for i, shape in ipairs(lanes) do
    local ready = P .. 'r:' .. shape
    local field = 'rk:' .. shape
    local old = st[field]
    local known = old and moved and not moved[shape]
    local head = heads[i]
    local new = nil
    if not head then
      redis.call('SREM', lanes_key, shape)
    else
      local D = parse_shape(shape)
      if quota_check(cfg, st, D) == nil then
        tiers[D.tier] = true
        if known or (old and string.sub(head, 1, 1) ~= '@'
                     and string.sub(old, HEAD_KEY_LEN + 1) == head) then
          new = old
        else
          local seq, at = entry_info(head)
          new = head_key(at, seq) .. head
        end
      end
    end
    -- without a remembered member, a set written before members carried the head key
    -- may hold the bare tenant name
    local old_member = old and ready_member(old, tenant) or tenant
    local new_member = new and ready_member(new, tenant)
    if old_member ~= new_member then redis.call('ZREM', ready, old_member) end
    if new and redis.call('ZADD', ready, share, new_member) == 1 then
      redis.call('SADD', P .. 'sh:' .. parse_shape(shape).tier, shape)
    end
    if old ~= new then
      if new then
        redis.call('HSET', P .. 'ts:' .. tenant, field, new)
      else
        redis.call('HDEL', P .. 'ts:' .. tenant, field)
      end
      st[field] = new
    end
  end
  mark_backlogged(tenant, cfg.w, tiers, st)
  mark_charged(tenant, st, next(tiers) ~= nil)
end

-- Write the tenant's ready-set scores again (share_of's bound as of NOW, else as of its
-- last fold), nothing else; `st`: its state (state_of).
local function rescore(tenant, st)
  local share = share_of(tenant, st, nil, 0, true)
  for field, head in pairs(st) do
    if string.sub(field, 1, 3) == 'rk:' then
      redis.call('ZADD', P .. 'r:' .. string.sub(field, 4), 'XX', share,
                 ready_member(head, tenant))
    end
  end
end

-- rt fell (note_run): the scores of the tenants in rq whose charge may still last (mean
-- start of their running slices later than NOW less rh, the highest rt since the last
-- such rescoring: no stored score used more) are written again with the new rt. Those
-- whose charge is over would score the same with any rt not above the one they used:
-- their score only grew since. So the work is per young tenant charged rt, not per
-- tenant: at most the tenants none of whose pods ended yet. Without NOW or rh (none
-- since rt was deleted): every tenant in rq.
local function rescore_charged()
  local high = NOW and tonumber(redis.call('GET', K_HIGH_RUN) or '')
  local young = high
    and redis.call('ZRANGEBYSCORE', K_CHARGED, string.format('%.17g', NOW - high), '+inf')
    or redis.call('ZRANGE', K_CHARGED, 0, -1)
  for _, tenant in ipairs(young) do rescore(tenant, state_of(tenant)) end
  redis.call('SET', K_HIGH_RUN, cluster_run())
end

-- a lane holds its entries as pack_entry makes them: a uuid ticket in 17 bytes
local function push_lane(tenant, shape, entry, at_head)
  redis.call(at_head and 'LPUSH' or 'RPUSH', lane_key(tenant, shape), pack_entry(entry))
  redis.call('SADD', P .. 'tl:' .. tenant, shape)
end

-- gangs ----------------------------------------------------------------------------
-- g:<gid> hash: t tenant, c class, n size, m queued members (comma list, arrival
-- order), r members running, sh shape of its lane entry while linked, bd the band
-- of its members (its first member's: admit gives every member that one), src and aw
-- where the gang was declared and what its unknown size awaits (words only: admit
-- writes them, nothing decides by them); gang_members and entry_info are above (ready
-- sets read them).

-- take a linked gang out of its lane: members back to G
local function gang_unlink(gid)
  local key = P .. 'g:' .. gid
  local g = hash_table(key)
  if (g.sh or '') == '' then return end
  redis.call('LREM', lane_key(g.t, g.sh), 1, '@' .. gid)
  for _, ticket in ipairs(gang_members(g)) do
    local rec = get_rec(ticket)
    count_lane(rec, -1)
    rec[F_STATE] = 'G'
    put_rec(ticket, rec)
  end
  redis.call('HDEL', key, 'sh')
end

-- link a gang into its lane once running + queued members reach its size
local function gang_link(gid, at_head)
  local key = P .. 'g:' .. gid
  local g = hash_table(key)
  local members = gang_members(g)
  if #members == 0 then
    if num(g, 'r') <= 0 then
      redis.call('DEL', key)
      redis.call('SREM', K_GANGS, gid)
    end
    return
  end
  if num(g, 'r') + #members < num(g, 'n') then return end
  local D = {i = {}, t = {}, b = {}}
  for _, ticket in ipairs(members) do
    local rec = get_rec(ticket)
    add_band_demand(D, rec)
    count_lane(rec, 1)
    rec[F_STATE] = 'Q'
    put_rec(ticket, rec)
  end
  local shape = format_shape(D)
  redis.call('HSET', key, 'sh', shape)
  push_lane(g.t, shape, '@' .. gid, at_head)
end


-- queue a new ticket record (state Q or G is decided here); rec[F_SEQ] must be set.
-- `st`: see bump_state (a gang member's counters are written without it)
local function enqueue(ticket, rec, at_head, st)
  local gid = rec[F_GANG]
  if gid == '' then
    bump_state(rec[F_TENANT], lane_deltas(rec, 1, queued_deltas(rec, 1, {})), st)
    rec[F_STATE] = 'Q'
    put_rec(ticket, rec)
    push_lane(rec[F_TENANT], single_shape(rec), ticket, at_head)
    return
  end
  count_queued(rec, 1)
  rec[F_STATE] = 'G'
  put_rec(ticket, rec)
  local key = P .. 'g:' .. gid
  gang_unlink(gid)
  -- the gang keeps the tenant it was created with (its lane is that tenant's)
  local m, t, n = unpack(redis.call('HMGET', key, 'm', 't', 'n'))
  -- the latest member's size, unless it is unknown (1000000, model.UNKNOWN_GANG_SIZE)
  -- and the gang's is known
  if not n or rec[F_GSIZE] ~= '1000000' then n = rec[F_GSIZE] end
  redis.call('HSET', key, 't', t or rec[F_TENANT], 'c', rec[F_CLASS], 'n', n,
             'm', (m and m ~= '') and (m .. ',' .. ticket) or ticket)
  redis.call('HSETNX', key, 'bd', rec[F_BAND])
  redis.call('SADD', K_GANGS, gid)
  gang_link(gid, at_head)
end

-- take a queued ticket (Q or G) out of the queue; its record stays. Returns the
-- tenant whose lane changed (a gang member's: the gang's tenant)
local function dequeue(ticket, rec)
  count_queued(rec, -1)
  local gid = rec[F_GANG]
  if gid == '' then
    local lane, entry = lane_key(rec[F_TENANT], single_shape(rec)), pack_entry(ticket)
    if redis.call('LREM', lane, 1, entry) == 0 and entry ~= ticket then
      redis.call('LREM', lane, 1, ticket)  -- a lane written before entries were packed
    end
    count_lane(rec, -1)
    return rec[F_TENANT]
  end
  local key = P .. 'g:' .. gid
  gang_unlink(gid)
  local g = hash_table(key)
  local kept = {}
  for _, t in ipairs(gang_members(g)) do
    if t ~= ticket then kept[#kept + 1] = t end
  end
  redis.call('HSET', key, 'm', table.concat(kept, ','))
  gang_link(gid, false)
  return g.t or rec[F_TENANT]
end

-- count a gang member that starts (+1) or stops (-1) running; returns the gang's
-- tenant (its lane may have changed), nil without a gang
local function gang_running(gid, sign)
  if gid == '' then return nil end
  local t = redis.call('HGET', P .. 'g:' .. gid, 't')
  if not t then return nil end
  gang_unlink(gid)
  redis.call('HINCRBY', P .. 'g:' .. gid, 'r', sign)
  gang_link(gid, false)
  return t
end

-- refresh the tenant of a ticket and, when another, the tenant whose lane changed
-- (a gang's members may belong to other tenants in a Redis written before admit
-- refused that)
local function refresh_both(tenant, other)
  refresh(tenant)
  if other and other ~= tenant then refresh(other) end
end

-- Handover (with a half-life): a running pod that ends frees a block of its shape, and
-- its tenant's next entry of that shape (same lane) is ordered, until its tier's next
-- dispatch decision, as if HANDOVER of one such pod's usage were not counted (see
-- favoured_tops). fr hash: '<tier>:s' lane shape, '<tier>:t' tenant of the last such pod.
local HANDOVER = 0.5
local function note_freed(rec)
  if not halflife().accrues or rec[F_GANG] ~= '' then return end
  local shape = single_shape(rec)
  local tier = parse_shape(shape).tier
  redis.call('HSET', P .. 'fr', tier .. ':s', shape, tier .. ':t', rec[F_TENANT])
end

-- Commitment (with a half-life): the fr hash also records, per tier, the lane capacity
-- is held for at the end of dispatch rounds ('<tier>:cs' shape, '<tier>:ct' tenant), its
-- tenant's slices in use when that began ('<tier>:cu') and when ('<tier>:ca'); see
-- note_hold. Once that has lasted COMMIT_AFTER x the tenant's expected run time, the
-- lane's head leads its tier's walk until its tenant runs one such entry more than then
-- (favoured_tops).
local COMMIT_AFTER = 0.5

-- free whatever the ticket holds and forget it. `reclaimed`: its pod was evicted by
-- reclaim, for another tenant owed the capacity: its tenant gets no handover of the
-- block (it would take back what was freed for the owed one), and its cut run teaches
-- nothing of how long its tenant's pods run
local function forget(ticket, rec, reclaimed)
  local state = rec[F_STATE]
  local changed
  unindex_name(ticket, rec)
  resv_remove(ticket)
  if state == 'R' or state == 'A' then
    if state == 'A' and not reclaimed then
      if note_run(rec[F_TENANT], tonumber(rec[F_AT])) then rescore_charged() end
      note_freed(rec)
    end
    add_usage(rec[F_TENANT], rec[F_BAND], parse_counts(rec[F_DEMAND]), -1, nil,
              tonumber(rec[F_AT]))
    note_running(ticket, rec[F_TENANT], parse_counts(rec[F_DEMAND]), -1)
    redis.call('HDEL', K_TICKETS, ticket)
    changed = gang_running(rec[F_GANG], -1)
  else
    changed = dequeue(ticket, rec)
    redis.call('HDEL', K_TICKETS, ticket)
  end
  refresh_both(rec[F_TENANT], changed)
end
