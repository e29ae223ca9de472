-- The fair queue's library, part usage: cluster capacity, usage and tickets (records, names, reservations).
-- Runs after the parts before it (fairshare/queue/calls.py LIB_PARTS), as one file.

-- cluster capacity -----------------------------------------------------------------

-- read once per resource (a missing field reads as false): USED[res][band], CAP[res]
local USED = {}
local CAP = {}

local function used_of(band, res)
  local u = USED[res]
  if not u then
    local v = redis.call('HMGET', K_USED, 'i:' .. res, 't:' .. res, 'b:' .. res)
    u = {i = tonumber(v[1] or '0'), t = tonumber(v[2] or '0'), b = tonumber(v[3] or '0')}
    USED[res] = u
  end
  return u[band]
end

local function cap_of(res)
  local c = CAP[res]
  if not c then
    c = tonumber(redis.call('HGET', K_CAP, res) or '0')
    CAP[res] = c
  end
  return c
end

-- Unused inference reserves: a tenant's inferenceReserve is the part of its nominal only
-- inference may use; with fairShare.lendInferenceReserve false (cfg.kr: the reserve
-- kept free), borrowed pods of any tenant may not stand in it either. K_IDLE_RESERVE
-- holds the sum over tenants of max(0, kr - inference in use) in slices, kept by
-- add_usage and counted again by count_idle_reserve. Read once per call: IDLE.reserve
-- that sum, IDLE.used the cluster's slices in use (all bands), IDLE.fit the capacity
-- entries are fitted against, in slices.
local IDLE = {}

-- the sum again, from every tenant's reserve and inference in use (sync, rebuild)
local function count_idle_reserve()
  local total = 0
  for _, tenant in ipairs(redis.call('SMEMBERS', K_TENANTS)) do
    local reserve = cfg_of(tenant).kr
    if reserve > 0 then
      local inference = tonumber(redis.call('HGET', P .. 'ts:' .. tenant, 'ui') or '0')
      total = total + math.max(0, reserve - inference)
    end
  end
  redis.call('SET', K_IDLE_RESERVE, total)
  IDLE.reserve = total
end

local cap_check
do
  local function idle_reserve()
    if not IDLE.reserve then IDLE.reserve = tonumber(redis.call('GET', K_IDLE_RESERVE) or '0') end
    return IDLE.reserve
  end

  -- the slices by which D (all bands) on top of the cluster's usage would leave less
  -- than the unused reserves free (<= 0: it leaves them)
  local function reserve_over(D)
    if not IDLE.used then
      IDLE.used = 0
      local flat = redis.call('HGETALL', K_USED)
      for i = 1, #flat, 2 do IDLE.used = IDLE.used + slices_of(flat[i]:sub(3)) * tonumber(flat[i + 1]) end
    end
    if not IDLE.fit then
      IDLE.fit = 0
      local seen = {}
      for _, res in ipairs(redis.call('HKEYS', K_CAP)) do
        seen[res] = true
        IDLE.fit = IDLE.fit + slices_of(res) * cap_of(res)
      end
      for res, _ in pairs(CAP) do
        if not seen[res] then IDLE.fit = IDLE.fit + slices_of(res) * cap_of(res) end
      end
    end
    return IDLE.used + slices(D.i) + slices(D.t) + slices(D.b) + idle_reserve() - IDLE.fit
  end

  -- nil when D (parse_shape) fits the cluster for each of its bands (bands of lower
  -- priority count as free), with guard reservations G[band][res] on top, and a borrowed
  -- part of D leaves the unused inference reserves free (in slices, over the whole
  -- cluster); else {res, units missing}, with a third field 'reserve' when only the
  -- reserves stand in the way. `empty` evaluates against an idle cluster (whose reserves
  -- are left out: inference using them would take the same capacity).
  function cap_check(D, G, empty)
    for _, band in ipairs(BAND_ORDER) do
      for _, res in ipairs(D.keys[band]) do
        local need = 0
        for _, b2 in ipairs(BAND_ORDER) do
          if PRIO[b2] >= PRIO[band] then
            need = need + (D[b2][res] or 0)
            if not empty then need = need + used_of(b2, res) end
          end
        end
        if G then need = need + (G[band][res] or 0) end
        local over = need - cap_of(res)
        if over > 0 then return {res, over} end
      end
    end
    if not empty and #D.keys.b > 0 and idle_reserve() > 0 then
      local over = reserve_over(D)
      if over > 0 then
        local res = D.keys.b[1]
        return {res, math.ceil(over / slices_of(res)), 'reserve'}
      end
    end
    return nil
  end
end

-- `st`: see bump_state
-- `started`: when the usage being added (sign 1) or removed (-1) began; nil: NOW when
-- adding
-- k:<band>:<capacity key>: the tenant's running units per placement class and band,
-- borrowed included (what per-class entitlements read; nothing else does)
local function add_usage(tenant, band, d, sign, st, started)
  fold_decay(tenant, st)
  local deltas = {['u' .. band] = sign * slices(d)}
  local reserve = band == 'i' and cfg_of(tenant).kr or 0
  if reserve > 0 then
    local inference = st and num(st, 'ui')
      or tonumber(redis.call('HGET', P .. 'ts:' .. tenant, 'ui') or '0')
    local change = math.max(0, reserve - inference - deltas.ui) - math.max(0, reserve - inference)
    if change ~= 0 then IDLE.reserve = redis.call('INCRBY', K_IDLE_RESERVE, change) end
  end
  if IDLE.used then IDLE.used = IDLE.used + deltas['u' .. band] end
  for k, v in pairs(d) do
    if band ~= 'b' then
      local field = 'u:' .. base_of(k)
      deltas[field] = (deltas[field] or 0) + sign * v
    end
    deltas['k:' .. band .. ':' .. k] = sign * v
    local now_used = redis.call('HINCRBY', K_USED, band .. ':' .. k, sign * v)
    if USED[k] then USED[k][band] = now_used end
  end
  bump_state(tenant, deltas, st)
  if halflife().virtual then
    local key = P .. 'ts:' .. tenant
    local rb
    if (st and usage_slices(st) or usage_slices(usage_state(tenant))) == 0 then
      rb = 0
      redis.call('HDEL', key, 'rb')
    else
      -- usage that began at an unknown time (rebuilt without it) is left out both ways
      local at = started
      if at == nil and sign > 0 then at = NOW end
      if at then rb = tonumber(redis.call('HINCRBYFLOAT', key, 'rb', sign * slices(d) * at)) end
    end
    if st and rb then st.rb = rb end
  end
  track_active(tenant, st or usage_state(tenant))
end

-- a ticket record with its declared run time `run` (seconds as text, '' for none): a
-- record of 13 fields gets an empty F_CLAIM first (the same as none)
local function with_run(rec, run)
  if run ~= '' then
    rec[F_CLAIM] = rec[F_CLAIM] or ''
    rec[F_RUN] = run
  end
  return rec
end

-- the declared run time of a ticket record, nil when it declares none
local function declared_run(rec)
  return rec and tonumber(rec[F_RUN] or '')
end

-- Expected ends (backfill): each capacity key's running and reserved tickets in the
-- sorted set re:<capacity key>, scored by when they are expected to end: their start
-- plus their tenant's expected run time at that moment (the cluster's before one of
-- its pods ended), or their declared run time (`run`, seconds; nil: none) when that is
-- shorter: it is an upper bound. Kept in every order; only virtual time reads it
-- (backfills).
local function note_running(ticket, tenant, d, sign, started, run)
  if sign > 0 then
    local ends = (started or NOW or 0) + math.min(expected_run(tenant), run or math.huge)
    for k, _ in pairs(d) do redis.call('ZADD', P .. 're:' .. k, ends, ticket) end
  else
    for k, _ in pairs(d) do redis.call('ZREM', P .. 're:' .. k, ticket) end
  end
end

-- tickets ----------------------------------------------------------------------------

local function get_rec(ticket)
  local raw = redis.call('HGET', K_TICKETS, ticket)
  if not raw then return nil end
  return split(raw, SEP)
end

-- add a ticket record's demand to the per-band totals D ({i = {}, t = {}, b = {}})
local function add_band_demand(D, rec)
  for k, v in pairs(parse_counts(rec[F_DEMAND])) do
    D[rec[F_BAND]][k] = (D[rec[F_BAND]][k] or 0) + v
  end
end

local function put_rec(ticket, rec)
  redis.call('HSET', K_TICKETS, ticket, table.concat(rec, SEP))
end

-- the uid of the pod a ticket record is bound to, '' while unseen (a record written
-- before uids were recorded has 12 fields: unseen)
local function uid_of(rec)
  return rec[F_UID] or ''
end

-- the uid that owns a ticket: the one it is bound to (seen), else the one that claimed it
-- at validation, else ''
local function owner_of(rec)
  local uid = uid_of(rec)
  if uid ~= '' then return uid end
  return rec[F_CLAIM] or ''
end

-- whether `name` is the pod name a record admitted as `stored` can get: itself, or for
-- `<prefix>*` (a generateName, already cut as the API server cuts it) the prefix plus
-- exactly GENERATED_SUFFIX characters
local function name_fits(stored, name)
  if stored == name then return true end
  local prefix = string.sub(stored, 1, -2)
  return string.sub(stored, -1) == '*' and #name == #prefix + GENERATED_SUFFIX
    and string.sub(name, 1, #prefix) == prefix
end

-- Growing bucket indexes (linear hashing): the name index and the unseen tickets are
-- spread over small keys <index>:<b>, each kept under Redis' 128-entry limit for its
-- compact listpack encoding (past it an entry costs several times the memory) however
-- many pods are known. An index starts with BASE_BUCKETS buckets; K_BUCKETS holds
-- `<index>:n`, its bucket count, and `<index>:c`, its entries. When the entries pass
-- BUCKET_LOAD a bucket, one more bucket is made by splitting bucket n - base (base: the
-- largest BASE_BUCKETS x 2^k <= n) by one more bit of the entries' hash, so that no
-- bucket ever holds more than about twice BUCKET_LOAD. Entries are placed by an
-- extended hash h: bucket h % base, or h % (2 x base) where that bucket is split
-- already. With BASE_BUCKETS buckets this is the placement of versions before growth
-- (h % 2048 is the first three hex digits of sha1, mod 2048), so their indexes read
-- the same; counts start at 0 on such a Redis, which only delays growth.
local BASE_BUCKETS = 2048
local BUCKET_LOAD = 40
local K_BUCKETS = P .. 'ix'

-- the bucket count of `index` (its key prefix without P, e.g. 'nm'), read once a call
local BUCKETS = {}
local function bucket_count(index)
  local n = BUCKETS[index]
  if not n then
    n = tonumber(redis.call('HGET', K_BUCKETS, index .. ':n') or BASE_BUCKETS)
    BUCKETS[index] = n
  end
  return n
end

-- the base of n buckets: the largest BASE_BUCKETS x 2^k at or below n
local function bucket_base(n)
  local base = BASE_BUCKETS
  while base * 2 <= n do base = base * 2 end
  return base
end

-- the key of the bucket of extended hash h in `index`
local function bucket_key(index, h)
  local n = bucket_count(index)
  local base = bucket_base(n)
  local b = h % base
  if b < n - base then b = h % (base * 2) end
  return P .. index .. ':' .. string.format('%d', b)
end

-- the extended hash of a sha1 hex digest: its first three digits (mod BASE_BUCKETS),
-- then 20 more bits from the next five
local function hash_of(hex)
  return tonumber(string.sub(hex, 1, 3), 16) % BASE_BUCKETS
    + BASE_BUCKETS * tonumber(string.sub(hex, 4, 8), 16)
end

-- `index` gained (delta 1) or lost (-1) an entry; after a gain past BUCKET_LOAD a
-- bucket, the next bucket splits: `split(from, to, base)` moves the entries of bucket
-- key `from` whose extended hash h has h % (2 x base) ~= h % base to bucket key `to`
local function bucket_counted(index, delta, split)
  local c = redis.call('HINCRBY', K_BUCKETS, index .. ':c', delta)
  if delta < 0 then return end
  local n = bucket_count(index)
  if c <= BUCKET_LOAD * n then return end
  local base = bucket_base(n)
  local s = n - base
  split(P .. index .. ':' .. string.format('%d', s),
        P .. index .. ':' .. string.format('%d', s + base), base)
  redis.call('HSET', K_BUCKETS, index .. ':n', n + 1)
  BUCKETS[index] = n + 1
end

-- delete every bucket of `index` and start it again at BASE_BUCKETS (rebuild)
local function buckets_clear(index)
  local n = bucket_count(index)
  for first = 0, n - 1, 256 do
    local keys = {}
    for b = first, math.min(first + 255, n - 1) do
      keys[#keys + 1] = P .. index .. ':' .. string.format('%d', b)
    end
    redis.call('DEL', unpack(keys))
  end
  redis.call('HDEL', K_BUCKETS, index .. ':n', index .. ':c')
  BUCKETS[index] = nil
end

-- name index (fairgate why <ns>/<pod>): a growing bucket index 'nm', hashes nm:<b>,
-- field = 48 bits of sha1(namespace/name) (its digits 4-15) as an integer, value = the
-- ticket ('u' + 16 bytes for a lowercase uuid, else 't' + the ticket). The extended
-- hash is the bucket's first three digits and the field's low 20 bits, so a split needs
-- no name. A hash collision only makes `find` miss.
-- the extended hash of a name whose first three digits (or bucket) are `low`
local function name_hash(low, field)
  return low % BASE_BUCKETS + BASE_BUCKETS * (field % 2 ^ 20)
end

local function name_slot(ns, name)
  local h = redis.sha1hex(ns .. '/' .. name)
  local field = tonumber(string.sub(h, 4, 15), 16)
  return bucket_key('nm', name_hash(tonumber(string.sub(h, 1, 3), 16), field)),
    string.format('%d', field)
end

local function split_names(from, to, base)
  local flat = redis.call('HGETALL', from)
  local bucket = tonumber(string.match(from, '(%d+)$'))
  local moved, gone = {}, {}
  for i = 1, #flat, 2 do
    local ext = name_hash(bucket, tonumber(flat[i]))
    if ext % (base * 2) ~= ext % base then
      moved[#moved + 1] = flat[i]
      moved[#moved + 1] = flat[i + 1]
      gone[#gone + 1] = flat[i]
    end
  end
  if #gone > 0 then
    redis.call('HSET', to, unpack(moved))
    redis.call('HDEL', from, unpack(gone))
  end
end

-- uuid tickets as 16 bytes and back (their tables are the block's own)
local uuid_bytes, uuid_text
do
  -- positions of the first hex digit of each byte in a uuid string
  local UUID_BYTES = {1, 3, 5, 7, 10, 12, 15, 17, 20, 22, 25, 27, 29, 31, 33, 35}
  -- two lowercase hex digits -> the byte they write
  local HEX_PAIR = (function()
    local t = {}
    for i = 0, 255 do t[string.format('%02x', i)] = string.char(i) end
    return t
  end)()

  -- the 16 bytes of a lowercase uuid ticket, nil for any other ticket
  function uuid_bytes(ticket)
    if #ticket ~= 36 or string.byte(ticket, 9) ~= 45 or string.byte(ticket, 14) ~= 45
        or string.byte(ticket, 19) ~= 45 or string.byte(ticket, 24) ~= 45 then  -- '-'
      return nil
    end
    local out = {}
    for j = 1, 16 do
      local i = UUID_BYTES[j]
      local byte = HEX_PAIR[string.sub(ticket, i, i + 1)]
      if not byte then return nil end
      out[j] = byte
    end
    return table.concat(out)
  end

  -- the uuid ticket of the 16 bytes at `from` .. `from` + 15 of `v`
  local UUID_FORMAT = string.rep('%02x', 4) .. '-' .. string.rep('%02x', 2) .. '-'
    .. string.rep('%02x', 2) .. '-' .. string.rep('%02x', 2) .. '-' .. string.rep('%02x', 6)
  function uuid_text(v, from)
    return string.format(UUID_FORMAT, string.byte(v, from, from + 15))
  end
end

-- A ticket as a member of an unseen-ticket bucket (rv:<b>) or an entry of a lane: a
-- lowercase uuid packed, PACKED and its 16 bytes (17 bytes, against 36); any other
-- ticket, and a gang's lane entry '@<gang id>', as it is. PACKED (byte 255) begins no
-- UTF-8 text, so a ticket written as text (by a version before packing, or not a uuid)
-- never reads as packed. An operation often packs one ticket several times (its lane,
-- its bucket, the name index): the last one packed is kept (PACK_IN, PACK_OUT; cleared
-- by begin()).
local PACKED = '\255'
local PACK_IN, PACK_OUT = nil, nil
local function pack_entry(entry)
  if entry == PACK_IN then return PACK_OUT end
  local bytes = uuid_bytes(entry)
  PACK_IN, PACK_OUT = entry, bytes and (PACKED .. bytes) or entry
  return PACK_OUT
end

local function unpack_entry(v)
  if #v ~= 17 or string.sub(v, 1, 1) ~= PACKED then return v end
  return uuid_text(v, 2)
end

-- the name index's form of a ticket: 'u' and its 16 bytes (a lowercase uuid), else 't'
-- and the ticket
local function pack_ticket(ticket)
  local packed = pack_entry(ticket)
  if packed == ticket then return 't' .. ticket end
  return 'u' .. string.sub(packed, 2)
end

local function unpack_ticket(v)
  if string.sub(v, 1, 1) == 't' then return string.sub(v, 2) end
  return uuid_text(v, 2)
end

-- Unseen tickets (no pod seen with them yet: reserved, queued or released), each with
-- the time it expires after (its admission or release): a growing bucket index 'rv',
-- sorted sets rv:<b>, member = pack_entry(ticket), score = that time; the extended hash
-- from sha1 of that member, since tickets need not be random (a time-ordered uuid, a
-- counter in a test's). The sorted set rv indexes the buckets: member b, score at most
-- the lowest score in rv:<b> (adding lowers it; removing leaves it, a lower bound, and
-- expire raises it to the lowest again). A version before buckets kept them all in one
-- sorted set, `resv` (member = the ticket): expire still reads it (see expire.lua),
-- nothing else writes it.
local K_UNSEEN = P .. 'rv'

local function resv_key(entry)
  return bucket_key('rv', hash_of(redis.sha1hex(entry)))
end

local function split_unseen(from, to, base)
  local flat = redis.call('ZRANGE', from, 0, -1, 'WITHSCORES')
  local moved, gone, lowest = {}, {}, nil
  for i = 1, #flat, 2 do
    local ext = hash_of(redis.sha1hex(flat[i]))
    if ext % (base * 2) ~= ext % base then
      moved[#moved + 1] = flat[i + 1]
      moved[#moved + 1] = flat[i]
      gone[#gone + 1] = flat[i]
      lowest = lowest or flat[i + 1]  -- (ZRANGE gives them lowest score first)
    end
  end
  if #gone > 0 then
    redis.call('ZADD', to, unpack(moved))
    redis.call('ZREM', from, unpack(gone))
    redis.call('ZADD', K_UNSEEN, 'LT', lowest, string.match(to, '(%d+)$'))
  end
end

-- the ticket expires after `at` (a time, as text or a number) unless its pod is seen
-- first; `entry`: pack_entry(ticket) if the caller has it
local function resv_add(ticket, at, entry)
  entry = entry or pack_entry(ticket)
  local key = resv_key(entry)
  local added = redis.call('ZADD', key, at, entry)
  redis.call('ZADD', K_UNSEEN, 'LT', at, string.match(key, '(%d+)$'))
  if added == 1 then bucket_counted('rv', 1, split_unseen) end
end

local function resv_remove(ticket)
  local entry = pack_entry(ticket)
  if redis.call('ZREM', resv_key(entry), entry) == 1 then
    bucket_counted('rv', -1, split_unseen)
  end
end

-- the time after which the ticket expires, nil when it does not (its pod was seen)
local function resv_score(ticket)
  local entry = pack_entry(ticket)
  return redis.call('ZSCORE', resv_key(entry), entry)
end

-- forget every unseen ticket's expiry (rebuild)
local function resv_clear()
  buckets_clear('rv')
  redis.call('DEL', K_UNSEEN, K_RESV)
end

local function index_name(ticket, rec)
  local key, field = name_slot(rec[F_NS], rec[F_NAME])
  if redis.call('HSET', key, field, pack_ticket(ticket)) == 1 then
    bucket_counted('nm', 1, split_names)
  end
end

local function unindex_name(ticket, rec)
  local key, field = name_slot(rec[F_NS], rec[F_NAME])
  if redis.call('HGET', key, field) == pack_ticket(ticket) then
    redis.call('HDEL', key, field)
    bucket_counted('nm', -1, split_names)
  end
end

-- the record takes the pod's own name (admitted as `<prefix>*`), in the name index too
local function take_name(ticket, rec, name)
  if rec[F_NAME] ~= name then
    unindex_name(ticket, rec)
    rec[F_NAME] = name
    index_name(ticket, rec)
  end
end

local function single_shape(rec)
  return rec[F_BAND] .. '/' .. rec[F_DEMAND]
end

-- qd:<band>:<res>, qs:<band> (queued demand, what admit counts as "queued ahead" when
-- it picks a band): queued tickets whose pod was seen (bound to a uid), so that an
-- entry whose pod never came to exist (a later admission step refused it) cannot push
-- a legitimate pod into the borrowed band (added to `deltas`); qk:<band>:<capacity key>
-- the same units per placement class (what per-class entitlements read)
local function seen_demand_deltas(rec, sign, deltas)
  local d = parse_counts(rec[F_DEMAND])
  for k, v in pairs(d) do
    local field = 'qd:' .. rec[F_BAND] .. ':' .. base_of(k)
    deltas[field] = (deltas[field] or 0) + sign * v
    field = 'qk:' .. rec[F_BAND] .. ':' .. k
    deltas[field] = (deltas[field] or 0) + sign * v
  end
  deltas['qs:' .. rec[F_BAND]] = (deltas['qs:' .. rec[F_BAND]] or 0) + sign * slices(d)
  return deltas
end

-- qc:<class> (queued tickets): every queued ticket, in a lane or in an incomplete
-- gang; and its queued demand once seen (added to `deltas`)
local function queued_deltas(rec, sign, deltas)
  deltas['qc:' .. rec[F_CLASS]] = (deltas['qc:' .. rec[F_CLASS]] or 0) + sign
  if uid_of(rec) ~= '' then seen_demand_deltas(rec, sign, deltas) end
  return deltas
end

-- qr:<class>:<res>: queued tickets in lanes (what the fast path must not jump)
-- (added to `deltas`)
local function lane_deltas(rec, sign, deltas)
  for k, _ in pairs(parse_counts(rec[F_DEMAND])) do
    local field = 'qr:' .. rec[F_CLASS] .. ':' .. k
    deltas[field] = (deltas[field] or 0) + sign
  end
  return deltas
end

-- a tenant's state (state_of) per placement class: its `<field>:<band>:<capacity key>`
-- counts (k: running, qk: queued) as units per key in all bands, and in band i. A
-- count below 0 reads as 0: a pod admitted by a version that kept no such counts and
-- freed by this one leaves one there until the next rebuild (the reconciler's).
local function class_counts(st, field)
  local all, inference = {}, {}
  local pattern = '^' .. field .. ':(%a):(.+)$'
  for k, v in pairs(st) do
    local band, key = string.match(k, pattern)
    if key then
      local n = math.max(0, tonumber(v))
      all[key] = (all[key] or 0) + n
      if band == 'i' then inference[key] = n end
    end
  end
  return all, inference
end

local function count_queued(rec, sign)
  bump_state(rec[F_TENANT], queued_deltas(rec, sign, {}))
end

local function count_lane(rec, sign)
  bump_state(rec[F_TENANT], lane_deltas(rec, sign, {}))
end
