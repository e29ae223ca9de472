-- Append a batch of audit records as the next links of the hash chain, atomically.
-- KEYS[1] the stream, KEYS[2] the chain head (a hash: seq, hash, floor)
-- ARGV[1] maxlen and ARGV[2] max age in ms ("0": any age), the exact retention: records
-- appended (stream ids: Redis time) more than max age ago are trimmed, then all but the
-- newest maxlen; ARGV[3], ARGV[4] the head (seq, hash) the writer
-- expects, or "" when it does not know; then, per record, three arguments: the SHA-256
-- hex of the record body (canonical JSON without seq/prev/hash), the body, and the link
-- hash the writer computed from the expected head ("" when it did not).
-- The link of record seq is SHA-256("<seq>:" .. bytes(prev) .. bytes(content)). When the
-- head is the one expected, the writer's links are the chain's: every record is appended
-- with them. Otherwise (another writer appended meanwhile, the chain was reset) only the
-- first record is appended, its link computed here, in pure Lua because Redis Lua only
-- offers SHA-1 (redis.sha1hex; the message is 2 blocks, the body never passes through
-- it): the writer links the rest from the head returned and calls again. So every call
-- appends at least one record (nobody starves) and hashes at most one link in Lua (a call
-- holds Redis briefly). The arguments a call relies on are checked before anything is
-- written (the links it stores when the head is the one expected, otherwise the content
-- digests: a malformed one refuses the whole call), and after the
-- first write Redis runs a script to its end (it refuses a script only at its first
-- write, e.g. when out of memory): what a call appends, it appends whole.
-- Returns {first seq, prev of the first record, link 1, ..., link n}: the n first records
-- were appended.
local band, bor, bxor = bit.band, bit.bor, bit.bxor
local rshift, ror, tobit, tohex = bit.rshift, bit.ror, bit.tobit, bit.tohex

local function sha256(msg)
  local K = {  -- built only when a link is hashed here (not on every call)
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
  }
  local len = #msg
  local bits = len * 8
  msg = msg .. '\128' .. string.rep('\0', (55 - len) % 64) .. string.char(0, 0, 0, 0,
    math.floor(bits / 16777216) % 256, math.floor(bits / 65536) % 256,
    math.floor(bits / 256) % 256, bits % 256)
  local h0, h1, h2, h3 = 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a
  local h4, h5, h6, h7 = 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19
  local w = {}
  for chunk = 1, #msg, 64 do
    for i = 0, 15 do
      local b1, b2, b3, b4 = string.byte(msg, chunk + i * 4, chunk + i * 4 + 3)
      w[i] = tobit(b1 * 16777216 + b2 * 65536 + b3 * 256 + b4)
    end
    for i = 16, 63 do
      local x, y = w[i - 15], w[i - 2]
      local s0 = bxor(ror(x, 7), ror(x, 18), rshift(x, 3))
      local s1 = bxor(ror(y, 17), ror(y, 19), rshift(y, 10))
      w[i] = tobit(w[i - 16] + s0 + w[i - 7] + s1)
    end
    local a, b, c, d, e, f, g, h = h0, h1, h2, h3, h4, h5, h6, h7
    for i = 0, 63 do
      local t1 = h + bxor(ror(e, 6), ror(e, 11), ror(e, 25))
        + bxor(g, band(e, bxor(f, g))) + K[i + 1] + w[i]
      local t2 = bxor(ror(a, 2), ror(a, 13), ror(a, 22))
        + bor(band(a, b), band(c, bor(a, b)))
      h, g, f, e = g, f, e, tobit(d + t1)
      d, c, b, a = c, b, a, tobit(t1 + t2)
    end
    h0, h1, h2, h3 = tobit(h0 + a), tobit(h1 + b), tobit(h2 + c), tobit(h3 + d)
    h4, h5, h6, h7 = tobit(h4 + e), tobit(h5 + f), tobit(h6 + g), tobit(h7 + h)
  end
  return tohex(h0) .. tohex(h1) .. tohex(h2) .. tohex(h3)
    .. tohex(h4) .. tohex(h5) .. tohex(h6) .. tohex(h7)
end

local function unhex(text)
  return (string.gsub(text, '..', function(pair) return string.char(tonumber(pair, 16)) end))
end

local function is_digest(text)
  return #text == 64 and string.match(text, '^%x+$') ~= nil
end

local head = redis.call('HMGET', KEYS[2], 'seq', 'hash', 'floor')
local seq_text = head[1] or '0'
local prev = head[2] or string.rep('0', 64)
local trusted = ARGV[3] == seq_text and ARGV[4] == prev
local count = (#ARGV - 4) / 3
if count < 1 or count % 1 ~= 0 then
  return redis.error_reply('audit append takes maxlen, max age, expected seq and hash, then '
    .. 'triples of content digest, body and link')
end
-- the 64-hex arguments this call relies on: the links it stores when trusted, else the
-- digests it links itself
local first_checked, checked = 5, 'content digest'
if trusted then first_checked, checked = 7, 'link hash' end
for i = first_checked, #ARGV, 3 do
  if not is_digest(ARGV[i]) then
    return redis.error_reply('audit ' .. checked .. ' must be 64 hex digits')
  end
end

local first = tonumber(seq_text) + 1
local reply = {string.format('%d', first), prev}  -- not seq .. '': Lua 5.1 would print 1e+15
local seq = first - 1
for i = 0, (trusted and count or 1) - 1 do
  seq = seq + 1
  seq_text = string.format('%d', seq)
  local link = ARGV[7 + 3 * i]
  if not trusted then
    link = sha256(seq_text .. ':' .. unhex(prev) .. unhex(ARGV[5 + 3 * i]))
  end
  redis.call('XADD', KEYS[1], '*',
    'seq', seq_text, 'prev', prev, 'hash', link, 'record', ARGV[6 + 3 * i])
  reply[#reply + 1] = link
  prev = link
end
-- The floor (lowest seq retention has not removed) moves up by what the age trim
-- removed, counted: a record deleted by someone else below it stays detectable.
local floor = tonumber(head[3] or '1')
local max_age = tonumber(ARGV[2])
if max_age > 0 then
  local now = redis.call('TIME')
  local min_id = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - max_age
  floor = floor + redis.call('XTRIM', KEYS[1], 'MINID', string.format('%d', min_id))
end
redis.call('XTRIM', KEYS[1], 'MAXLEN', ARGV[1])  -- exact, once per call
floor = string.format('%d', math.max(floor, seq - tonumber(ARGV[1]) + 1, 1))
redis.call('HSET', KEYS[2], 'seq', seq_text, 'hash', prev, 'floor', floor)
return reply
