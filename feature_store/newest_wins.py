"""The Lua scripts behind the store's newest-wins writes: Redis runs each call atomically, so a slot
or a tile is compared with what is stored and replaced in one step, whatever else writes at once."""

from __future__ import annotations

import hashlib

# A written key's expiry is set to `ttl` only when it has none, or has run down by a tenth of the TTL (60 s
# at most), or when it is longer than `ttl` (the TTL was lowered): an EXPIRE on every write cost Redis
# about 2 µs of its 6 per key write (one more command, and a PEXPIREAT in the append-only file),
# where reading the expiry costs 0.4-0.8. So a key expires between `ttl` less that slack and `ttl`
# after its last write. Reading the expiry before a write needs scripts replicated by their effects
# (Redis 5's default, its only mode since 7). Prepended to each script; `ttl` is ARGV[1] in both.
KEEP_ALIVE = """
local function keep_alive(key, ttl)
  if ttl <= 0 then return end
  local left, ttl_ms = redis.call('PTTL', key), ttl * 1000
  if left < ttl_ms - math.min(ttl_ms / 10, 60000) or left > ttl_ms then redis.call('EXPIRE', key, ttl) end
end
"""
# Many slots per call. KEYS: the entity hashes. ARGV: ttl_s, fields per slot, then per key that
# many field/value pairs. The first value starts with the window end, a packed float64 (struct '<d').
# A slot is replaced only when the incoming window ends at or after the stored one; a first value of
# another length was written in another layout and is replaced. Returns how many slots were.
NEWEST_WINS = KEEP_ALIVE + """
local ttl = tonumber(ARGV[1])
local stride = 2 * tonumber(ARGV[2])
local written = 0
for k = 1, #KEYS do
  local base = 2 + (k - 1) * stride
  local current = redis.call('HGET', KEYS[k], ARGV[base + 1])
  local incoming = ARGV[base + 2]
  if not current or #current ~= #incoming or struct.unpack('<d', current) <= struct.unpack('<d', incoming) then
    redis.call('HSET', KEYS[k], unpack(ARGV, base + 1, base + stride))
    keep_alive(KEYS[k], ttl)
    written = written + 1
  end
end
return written
"""
NEWEST_WINS_SHA = hashlib.sha1(NEWEST_WINS.encode()).hexdigest().encode()  # Redis names a script by it
# Many tiles of one horizon per call. KEYS: the progress hash, then the entity hashes. ARGV: ttl_s, the
# ring's field prefix, the progress field, tiles per ring, bytes per tile, tiles per field, the sketch
# fields' prefix, then per entity its ring position, its tile (the window end first) and its
# counterpart hashes (maybe none), kept beside the tile with its window end. A tile is spliced into
# the field holding its position; a ring's first tile writes all of its fields, zeros where no tile
# was. The progress is the newest tile end written and the ring's length.
TILES_NEWEST_WINS = KEEP_ALIVE + """
local ttl, prefix, progress_field = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local n, width, per_field, sketches = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local parts = math.ceil(n / per_field)
local full, last = string.rep('\\0', per_field * width), string.rep('\\0', (n - (parts - 1) * per_field) * width)
local function zeros_of(part) if part == parts - 1 then return last end return full end
local written, newest = 0, 0
for k = 2, #KEYS do
  local base = 3 * k + 2
  local position, tile, hashes = tonumber(ARGV[base]), ARGV[base + 1], ARGV[base + 2]
  local part = math.floor(position / per_field)
  local at, field, zeros = (position % per_field) * width, prefix .. part, zeros_of(part)
  local ends = struct.unpack('<d', tile)
  if ends > newest then newest = ends end
  local current = redis.call('HGET', KEYS[k], field)
  local fresh = not current
  if fresh or #current ~= #zeros then current = zeros end
  if struct.unpack('<d', current, at + 1) <= ends then
    local value = string.sub(current, 1, at) .. tile .. string.sub(current, at + width + 1)
    local sketch = #hashes > 0 and string.sub(tile, 1, 8) .. hashes
    if fresh then
      -- every part, a thousand per HSET (Lua unpacks at most about 8,000 values)
      for from = 0, parts - 1, 1000 do
        local args = {}
        for j = from, math.min(from + 999, parts - 1) do
          args[#args + 1] = prefix .. j
          args[#args + 1] = j == part and value or zeros_of(j)
        end
        redis.call('HSET', KEYS[k], unpack(args))
      end
      if sketch then redis.call('HSET', KEYS[k], sketches .. position, sketch) end
    elseif sketch then
      redis.call('HSET', KEYS[k], field, value, sketches .. position, sketch)
    else
      redis.call('HSET', KEYS[k], field, value)
    end
    keep_alive(KEYS[k], ttl)
    written = written + 1
  end
end
local progress = redis.call('HGET', KEYS[1], progress_field)
local stale = not progress or #progress ~= 16
if stale or struct.unpack('<d', progress) < newest or struct.unpack('<d', progress, 9) ~= n then
  redis.call('HSET', KEYS[1], progress_field, struct.pack('<dd', newest, n))
end
return written
"""
SCRIPTS = {hashlib.sha1(s.encode()).hexdigest().encode(): s for s in (NEWEST_WINS, TILES_NEWEST_WINS)}
TILES_NEWEST_WINS_SHA = next(sha for sha, s in SCRIPTS.items() if s == TILES_NEWEST_WINS)
