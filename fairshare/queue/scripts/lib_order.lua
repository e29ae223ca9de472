-- The fair queue's library, part order: ordering: the walk over the lanes for the next entry of a tier.
-- Runs after the parts before it (fairshare/queue/calls.py LIB_PARTS), as one file.

-- ordering ---------------------------------------------------------------------------


local function tier_shapes(tier)
  return redis.call('SMEMBERS', P .. 'sh:' .. tier)
end

-- A tenant in a ready set whose lane is empty is stale (a Redis written before admit
-- refused gangs spanning tenants could move a gang to another tenant's lane without
-- refreshing the first): it is skipped, and dropped by writing scripts. `member`: its
-- member in the ready set.
local function drop_stale(tenant, shape, member)
  redis.call('ZREM', P .. 'r:' .. shape, member)
  redis.call('SREM', P .. 'tl:' .. tenant, shape)
  redis.call('HDEL', P .. 'ts:' .. tenant, 'rk:' .. shape)
end

-- Queue order of two entries {score, key = head_key(submitted_at, seq)}: the lower
-- fair-share score, then the head pod created first (submitted_at), then admitted
-- first (seq). Never the name.
local function before(a, b)
  if a.score ~= b.score then return a.score < b.score end
  return a.key < b.key
end

-- The first tenant in queue order in the ready set of `shape` (a survey top), or nil;
-- with `after` (a top of this shape), the first one after it in queue order.
-- The set orders (stored score, head key). Without a half-life stored scores are
-- exact: the first member (after `after`) is the answer. With one they are lower
-- bounds (share_of), so the walk goes on while a stored (score, key) could still beat
-- the best current one. `check` (the shape is blocked, so a top may be held for):
-- members whose lane is empty are stale, skipped (dropped when `tidy`).
-- `scores` (optional): tenant -> {current score at `now`, its bound}, shared by the
-- walks of one plan (nothing it calls changes a tenant's usage), so a tenant waiting in
-- several ready sets is scored once.
-- With a half-life the members are read in batches that double (up to WALK_BATCH):
-- most walks stop after a member or two, a long one (every stored score stale, e.g.
-- scores written while the tenants' decayed usage was still 0) costs a read per batch
-- instead of per member. A stale member dropped on the way keeps the rank of the next.
local WALK_BATCH = 64
local function best_of(shape, D, now, tidy, check, after, scores)
  local key = P .. 'r:' .. shape
  local decay = halflife().accrues
  local best, rank = nil, 0
  -- with `tidy`, the bounds (share_of) computed on the way replace the stored ones once
  -- the walk is over, so the next walk starts from tighter bounds
  local fresh = {}
  local batch, at, size = {}, 1, decay and 2 or 1
  while true do
    if at > #batch then
      batch = redis.call('ZRANGE', key, rank, rank + size - 1, 'WITHSCORES')
      at = 1
      size = math.min(size * 2, WALK_BATCH)
    end
    if at > #batch then break end
    local member = batch[at]
    local top = {shape = shape, D = D, score = tonumber(batch[at + 1]), member = member}
    at = at + 2
    top.key, top.tenant = member_parts(member)
    if best and not before(top, best) then break end
    if check and redis.call('EXISTS', lane_key(top.tenant, shape)) == 0 then
      if tidy then drop_stale(top.tenant, shape, member) else rank = rank + 1 end
    else
      rank = rank + 1
      if decay then
        local stored = top.score
        local known = scores and scores[top.tenant]
        if not known then
          local st = usage_state(top.tenant)
          known = {share_of(top.tenant, st, now), share_of(top.tenant, st, now, 0, true)}
          if scores then scores[top.tenant] = known end
        end
        top.score = known[1]
        if tidy and known[2] > stored then
          fresh[#fresh + 1] = known[2]
          fresh[#fresh + 1] = member
        end
      end
      if after == nil or before(after, top) then
        if best == nil or before(top, best) then best = top end
        if not decay then return best end
      end
    end
  end
  for i = 1, #fresh, 2000 do  -- (unpack has a limit on how many values it returns)
    redis.call('ZADD', key, 'XX', unpack(fresh, i, math.min(i + 1999, #fresh)))
  end
  return best
end

-- The ready entries of a tier, one per shape (its first tenant in queue order), sorted
-- in queue order; each top: shape, tenant, score, key, D (parse_shape), blocked
-- (cap_check without holds). `tidy` (writing scripts only) forgets shapes whose ready
-- set is empty and stale tenants found on the way (others are skipped).
local function survey(tier, now, tidy, scores)
  local tops = {}
  for _, shape in ipairs(tier_shapes(tier)) do
    local D = parse_shape(shape)
    local blocked = cap_check(D, nil, false)
    local top = best_of(shape, D, now, tidy, blocked ~= nil, nil, scores)
    if top then
      top.blocked = blocked
      tops[#tops + 1] = top
    elseif tidy and redis.call('EXISTS', P .. 'r:' .. shape) == 0 then
      redis.call('SREM', P .. 'sh:' .. tier, shape)
    end
  end
  table.sort(tops, before)
  return tops
end

-- Whether the tenant of a top is below its weighted share of the cluster: slices in
-- use / weight < capacity slices / (summed weight of the tenants with a ready entry of
-- the tier). That share is at most the tenant's water-filled entitlement, so a tenant
-- at or above its entitlement is never below it.
-- `bw`: {tier = summed weight} read once per plan (nothing writes bw during one).
local function below_share(top, tier, bw)
  local capacity = cap_slices()
  if bw[tier] == nil then bw[tier] = tonumber(redis.call('HGET', P .. 'bw', tier) or '0') end
  local w = bw[tier]
  if w <= 0 then return false end
  if not halflife().accrues then
    -- with current usage only the top's score is slices in use / weight (refresh writes it
    -- at every change of either): it decides, unless the product's rounding could
    local margin = top.score * w - capacity
    if math.abs(margin) > 1e-9 * capacity then return margin < 0 end
  end
  -- only the usage fields: the whole state (lane heads, queue counters) is not needed
  local used = usage_slices(usage_state(top.tenant))
  return used * w < capacity * cfg_of(top.tenant).w
end
