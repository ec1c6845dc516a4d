"""The Lua scripts behind the store's newest-wins writes: Redis runs each call atomically, so a slot
or a tile is compared with what is stored and replaced in one step, whatever else writes at once."""

from __future__ import annotations

import hashlib

# Many slots per call. KEYS: the entity hashes. ARGV: ttl_s, fields per slot, then per key that
# many field/value pairs. The first value starts with the window end, a packed float64 (struct '<d').
# A slot is replaced only when the incoming window ends at or after the stored one; a first value of
# another length was written in another layout and is replaced. Returns how many slots were.
NEWEST_WINS = """
local ttl = tonumber(ARGV[1])
local stride = 2 * tonumber(ARGV[2])
local written = 0
for k = 1, #KEYS do
  local base = 2 + (k - 1) * stride
  local current = redis.call('HGET', KEYS[k], ARGV[base + 1])
  local incoming = ARGV[base + 2]
  if not current or #current ~= #incoming or struct.unpack('<d', current) <= struct.unpack('<d', incoming) then
    redis.call('HSET', KEYS[k], unpack(ARGV, base + 1, base + stride))
    if ttl > 0 then redis.call('EXPIRE', KEYS[k], ttl) end
    written = written + 1
  end
end
return written
"""
NEWEST_WINS_SHA = hashlib.sha1(NEWEST_WINS.encode()).hexdigest().encode()  # Redis names a script by it
# Many tiles of one horizon per call. KEYS: the progress hash, then the entity hashes. ARGV: ttl_s, the
# ring's field, tiles per ring, bytes per tile, the sketch fields' prefix, then per entity its ring
# position, its tile (the window end first) and its counterpart hashes (maybe none), kept beside the
# tile with its window end. A ring of another length (flink.horizon_slides_s changed) starts over.
TILES_NEWEST_WINS = """
local ttl, field, n, width, sketches = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local written, newest = 0, 0
for k = 2, #KEYS do
  local base = 3 * k
  local position, tile, hashes = ARGV[base], ARGV[base + 1], ARGV[base + 2]
  local at = tonumber(position) * width
  local ends = struct.unpack('<d', tile)
  if ends > newest then newest = ends end
  local ring = redis.call('HGET', KEYS[k], field)
  if not ring or #ring ~= n * width then ring = string.rep('\0', n * width) end
  if struct.unpack('<d', ring, at + 1) <= ends then
    redis.call('HSET', KEYS[k], field, string.sub(ring, 1, at) .. tile .. string.sub(ring, at + width + 1))
    if #hashes > 0 then redis.call('HSET', KEYS[k], sketches .. position, string.sub(tile, 1, 8) .. hashes) end
    if ttl > 0 then redis.call('EXPIRE', KEYS[k], ttl) end
    written = written + 1
  end
end
local progress = redis.call('HGET', KEYS[1], field)
if not progress or #progress ~= 8 or struct.unpack('<d', progress) < newest then
  redis.call('HSET', KEYS[1], field, struct.pack('<d', newest))
end
return written
"""
SCRIPTS = {hashlib.sha1(s.encode()).hexdigest().encode(): s for s in (NEWEST_WINS, TILES_NEWEST_WINS)}
TILES_NEWEST_WINS_SHA = next(sha for sha, s in SCRIPTS.items() if s == TILES_NEWEST_WINS)
