"""Redis implementation of the online store (see keys.py for the layout).

Writes go out as one request per batch, one server-side script call per 500 (entity, horizon)
slots: the script replaces a slot only when the incoming window ends at or after the stored one, so
replays, restarts and backfills never overwrite newer values. Inside a batch the newest window per
slot is picked before anything is sent. The request's bytes are built column by column (a batch
decoded in bulk, `schemas.bulk`, needs no record objects): every slot of one horizon has the same
field names, so its arguments are one fixed template with the values copied in, where redis-py's
pipeline encoded each of twenty arguments per slot in Python.

A tile of a longer horizon goes into its position of the entity's ring (`feature_store.keys`) by a
second script, which splices it in when it ends at or after the tile there, and raises the horizon's
progress. A read of such a horizon fetches the ring and adds its tiles up in numpy.

Every value is stored as 8 bytes, a little-endian float64: a read turns the replies into a matrix
with one `np.frombuffer`, where decimal text cost a parse per value, and Redis answers faster too
(it keeps short decimal strings as integers and formats them back on every read). Reads are plain
HMGETs, one per entity, sent as one pre-encoded pipeline; redis-py's pipeline builds and parses each
command in Python, at about the cost of Redis's own work. Their replies are read as bytes and, when
every field is there, cut into columns in numpy without a parse per reply (`feature_store.resp`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import struct
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from core.settings import FlinkSettings, RedisSettings
from feature_store import resp
from feature_store.base import UNKNOWN_WINDOW_END, OnlineFeatures, RecentEngagements
from feature_store.columns import VALUE_FIELDS, FeatureColumns
from feature_store.keys import (
    RECENT_FIELD,
    RECENT_HORIZON_S,
    TILE_BYTES,
    TILE_VALUES,
    entity_key,
    entity_key_prefix,
    field_name,
    progress_key,
    sketch_field,
    sketch_field_prefix,
    split_feature_name,
    tiles_field,
    window_end_field,
)
from feature_store.resp import RowLayout, bulk_strings
from schemas.feature_set import HORIZONS_S

# Many slots per call. KEYS: the entity hashes. ARGV: ttl_s, fields per slot, then per key that
# many field/value pairs, the window end's first. Values are packed float64s (struct '<d'). A slot
# is replaced only when the incoming window ends at or after the stored one. Returns how many were.
NEWEST_WINS = """
local ttl = tonumber(ARGV[1])
local stride = 2 * tonumber(ARGV[2])
local written = 0
for k = 1, #KEYS do
  local base = 2 + (k - 1) * stride
  local current = redis.call('HGET', KEYS[k], ARGV[base + 1])
  if not current or #current ~= 8 or struct.unpack('<d', current) <= struct.unpack('<d', ARGV[base + 2]) then
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
VALUE_BYTES = 8
PACKED_NAN = np.float64(np.nan).tobytes()
TILE_FLOATS = TILE_BYTES // VALUE_BYTES
SLOTS_PER_CALL = 500
ENTITIES_PER_SEND = 10_000  # bounds the request and reply held in memory at once (< 2**_ENTITY_BITS)
SCRATCH_KEPT_BYTES = 1 << 23  # a thread keeps read buffers up to this size; a larger send's are its own


class RedisFeatureStore:
    """FeatureWriter and FeatureReader over one Redis database; the client is created on first use."""

    def __init__(self, url: str, key_prefix: str, ttl_s: int, connection: Mapping[str, Any] | None = None,
                 tiles_s: Mapping[int, int] | None = None) -> None:
        """`connection`: what `redis.Redis.from_url` needs beyond the URL (ACL user, password, TLS files).
        `tiles_s`: the horizons kept as tiles, with their tile length (`tile_layout`); the others are
        read as one window each."""
        self.url = url
        self.connection = dict(connection or {})
        self.prefix = key_prefix
        self.ttl_s = ttl_s
        self.tiles_s = dict(tiles_s or {})
        self._client: redis.Redis | None = None
        # buffers each thread's reads reuse: fresh ones of megabytes cost a page fault per 4 KB, about a
        # tenth of a 1,000-entity read each (kept up to SCRATCH_KEPT_BYTES each, about 2,800 entities)
        self._scratch = threading.local()

    @classmethod
    def from_settings(cls, redis_settings: RedisSettings, flink: FlinkSettings) -> RedisFeatureStore:
        """The store of these Redis settings, read with the tiles the feature job of `flink` writes."""
        return cls(redis_settings.url, redis_settings.key_prefix, redis_settings.ttl_s,
                   redis_settings.connection_kwargs(), tile_layout(flink))

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = redis.Redis.from_url(self.url, **self.connection)
        return self._client

    def write_batch(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Writes FeatureRecords (dicts); returns how many slots were replaced."""
        return self.write_columns(FeatureColumns.of_records(records))

    def write_columns(self, batch: FeatureColumns) -> int:
        """Writes a batch of FeatureRecords as columns; returns how many slots were replaced."""
        if not len(batch):
            return 0
        keys = batch.keys(self.prefix)
        rows = batch.newest_per_slot(keys)
        rings, positions = (a[rows] for a in batch.tiles)
        horizons = batch.horizon_s[rows]
        commands: list[bytes] = []
        for horizon, ring in sorted({*zip(horizons.tolist(), rings.tolist(), strict=True)}):
            of_ring = (horizons == horizon) & (rings == ring)
            if ring:
                commands += self._tiles_commands(horizon, ring, rows[of_ring], positions[of_ring], batch, keys)
                continue
            of_horizon = rows[of_ring]
            for start in range(0, len(of_horizon), SLOTS_PER_CALL):
                chunk = of_horizon[start:start + SLOTS_PER_CALL]
                chunk_keys = [keys[i] for i in chunk.tolist()]
                if horizon == RECENT_HORIZON_S:
                    commands.append(self._lists_command(batch, chunk, chunk_keys))
                else:
                    commands.append(self._values_command(horizon, batch.values(chunk), chunk_keys))
        return sum(self._send_scripts(commands))

    def _values_command(self, horizon_s: int, values: np.ndarray, keys: list[bytes]) -> bytes:
        """One call of the script for slots of one horizon: `values` [slots, window end + values]."""
        template, value_at = _slot_template(horizon_s)
        args = np.tile(template, (len(values), 1))
        packed = np.ascontiguousarray(values, dtype="<f8").view(np.uint8).reshape(len(values), -1, VALUE_BYTES)
        args[:, value_at + np.arange(VALUE_BYTES)[None, :]] = packed
        return self._script_call(keys, [self.ttl_s, len(value_at)], args.tobytes(), len(keys) * 2 * len(value_at))

    def _tiles_commands(self, horizon_s: int, ring: int, rows: np.ndarray, positions: np.ndarray,
                        batch: FeatureColumns, keys: list[bytes]) -> list[bytes]:
        """Calls of the tiles script for tiles of one horizon and ring length."""
        head = [tiles_field(horizon_s).encode(), b"%d" % ring, b"%d" % TILE_BYTES,
                sketch_field_prefix(horizon_s).encode()]
        tiles = np.ascontiguousarray(batch.tile_values(rows), dtype="<f8").tobytes()
        sketches = batch.sketches(rows)
        commands = []
        for start in range(0, len(rows), SLOTS_PER_CALL):
            chunk = range(start, min(start + SLOTS_PER_CALL, len(rows)))
            args = [part for i in chunk for part in (b"%d" % positions[i],
                                                     tiles[i * TILE_BYTES:(i + 1) * TILE_BYTES], sketches[i])]
            commands.append(self._script_call([progress_key(self.prefix).encode(), *(keys[rows[i]] for i in chunk)],
                                              [self.ttl_s], bulk_strings([*head, *args]), len(head) + len(args),
                                              TILES_NEWEST_WINS_SHA))
        return commands

    def _lists_command(self, batch: FeatureColumns, rows: np.ndarray, keys: list[bytes]) -> bytes:
        """One call of the script for users' recent engagements, newest window wins as for the other slots."""
        end_field, recent_field = window_end_field(RECENT_HORIZON_S).encode(), RECENT_FIELD.encode()
        parts: list[bytes] = []
        for row in rows.tolist():
            listed = json.dumps(batch.recent(row), separators=(",", ":")).encode()
            parts += (end_field, struct.pack("<d", batch.window_end[row]), recent_field, listed)
        return self._script_call(keys, [self.ttl_s, 2], bulk_strings(parts), len(parts))

    def _script_call(self, keys: list[bytes], head_args: list[int], args: bytes, n_args: int,
                     sha: bytes = NEWEST_WINS_SHA) -> bytes:
        """EVALSHA of a script in RESP: the keys, `head_args`, then `args` (already RESP)."""
        head = [str(a).encode() for a in head_args]
        return (b"*%d\r\n$7\r\nEVALSHA\r\n" % (3 + len(keys) + len(head) + n_args)
                + bulk_strings([sha, b"%d" % len(keys), *keys, *head]) + args)

    def _send_scripts(self, commands: list[bytes], loaded: bool = False) -> list[int]:
        """Sends the script calls in one round trip; their replies (slots replaced per call). A Redis that
        lost its scripts (restarted) gets the script again and every call again: replacing only by a
        newer or equal window end makes the second sending harmless."""
        replies = self._round_trip(commands, len(commands))
        errors = [r for r in replies if isinstance(r, Exception)]
        if not loaded and any(str(e).startswith("NOSCRIPT") for e in errors):
            for script in SCRIPTS.values():
                self.client.script_load(script)
            return self._send_scripts(commands, loaded=True)
        if errors:
            raise redis.ResponseError(f"writing features: {errors[0]}")
        return [int(r) for r in replies]

    def get_recent_engagements(self, user_ids: Sequence[str]) -> list[RecentEngagements | None]:
        pipe = self.client.pipeline(transaction=False)
        for user_id in user_ids:
            pipe.hmget(entity_key(self.prefix, "user", user_id), window_end_field(RECENT_HORIZON_S), RECENT_FIELD)
        got: list[RecentEngagements | None] = []
        for end, listed in pipe.execute():
            if end is None or listed is None:
                got.append(None)
                continue
            lists = json.loads(listed)
            got.append(RecentEngagements(lists["items"], lists["types"], lists["times_ms"],
                                         int(struct.unpack("<d", end)[0])))
        return got

    def get_online_features(self, entity_type: str, ids: Sequence[str], names: Sequence[str]) -> OnlineFeatures:
        plan = _read_plan(tuple(names), tuple(sorted(self.tiles_s.items())))
        prefix = entity_key_prefix(self.prefix, entity_type).encode()
        values, ends = np.empty((len(ids), len(names))), np.empty((len(ids), len(names)), dtype=np.int64)
        as_of: list[float | None] = []
        for start in range(0, len(ids), ENTITIES_PER_SEND):
            part = ids[start:start + ENTITIES_PER_SEND]
            chunk = self._read_chunk(prefix, part, plan, not start)
            if not start:  # every send is merged as of the first one's progress
                as_of = [None if p is None else float(np.frombuffer(p, dtype="<f8")[0]) for p in chunk.progress]
            rows = slice(start, start + len(part))
            self._fill(values[rows], ends[rows], chunk, plan, as_of, prefix, part)
        return OnlineFeatures(list(names), values, ends)

    def _fill(self, values: np.ndarray, ends: np.ndarray, chunk: _Chunk, plan: _ReadPlan,
              as_of: list[float | None], prefix: bytes, ids: Sequence[str]) -> None:
        """The values and window ends [entity, name] of one send's entities, from what `_read_chunk` got."""
        if len(plan.plain_out):
            values[:, plan.plain_out] = chunk.plain[:, plan.plain_in]
            end = chunk.plain[:, plan.plain_end_in]
            ends[:, plan.plain_out] = np.where(np.isnan(end), UNKNOWN_WINDOW_END, end)
        if plan.tiled:
            merged, end = _merged_rings(chunk.rings, plan, as_of)
            for r in plan.distinct_rings:
                merged[:, r, _MERGED.index(DISTINCT)] = self._distinct_counts(
                    prefix, ids, plan.tiled[r][0], _ring_tiles(chunk.rings, plan, r), as_of[r])
            values[:, plan.tiled_out] = merged.reshape(len(ids), len(plan.tiled) * len(_MERGED))[:, plan.tiled_in]
            values[:, plan.unknown_out] = np.nan
            ends[:, plan.tiled_out] = end[:, plan.tiled_ring]
            ends[:, plan.unknown_out] = end[:, plan.unknown_ring]

    def _distinct_counts(self, prefix: bytes, ids: Sequence[str], horizon_s: int, tiles: np.ndarray,
                         as_of_ms: float | None) -> np.ndarray:
        """Distinct counterparts over a tiled horizon from the sketches beside the rings `tiles`, in
        one more round trip per send (`distinct_counts`); NaN for an entity with no tile."""
        ring = tiles.shape[1]
        head = b"*%d\r\n$5\r\nHMGET\r\n" % (ring + 2)
        tail = bulk_strings([sketch_field(horizon_s, p).encode() for p in range(ring)])
        counts = np.full(len(ids), np.nan)
        known = np.flatnonzero((tiles[:, :, 0] > 0).any(axis=1))
        for start in range(0, len(known), ENTITIES_PER_SEND):
            rows = known[start:start + ENTITIES_PER_SEND]
            payload = b"".join([b"%s$%d\r\n%s%s\r\n%s" % (head, len(prefix) + len(e), prefix, e, tail)
                                for e in (ids[i].encode() for i in rows.tolist())])
            sketches = _without_errors(self._round_trip([payload], len(rows)))
            counts[rows] = distinct_counts(tiles[rows], sketches, horizon_s, as_of_ms)
        return counts

    def fields_read(self, names: Sequence[str]) -> list[str]:
        """The hash fields one entity's read of `names` asks for (the progress is read once per call)."""
        return _read_plan(tuple(names), tuple(sorted(self.tiles_s.items()))).fields

    def _read_chunk(self, prefix: bytes, ids: Sequence[str], plan: _ReadPlan, first: bool) -> _Chunk:
        """`HMGET prefix+id *fields` for every id in one round trip, on the `first` chunk after the
        progress of the tiled horizons: the plain values [entity, column] (NaN where missing), the rings
        one after another [entity, ring floats] (zeros where missing; this thread's scratch, valid until
        its next read) and the progress replies. The progress is read first: a tile written after it
        ends after it, and a merge as of the progress leaves it out."""
        with_progress = first and bool(plan.tiled)
        marker, end = resp.end_marker()
        # the bytes in front of a key depend on its length alone: one lookup and a join per key
        before, after = _before_key(plan.head, prefix), b"\r\n" + plan.tail
        keys = [k for e in map(str.encode, ids) for k in (before(len(e)), e, after)]
        payload = b"".join([self._progress_command(plan) if with_progress else b"", *keys, marker])
        n, n_replies = len(ids), len(ids) + with_progress + 1
        got = self._round_trip_raw(payload, end, n_replies, n * plan.layout.width)
        # the progress reply in front, and the bytes it takes (none without it)
        head = None if isinstance(got, list) else resp.leading_reply(got) if with_progress else ([], 0)
        rows = None if head is None else resp.fixed_rows(got, n, plan.layout, head[1])
        if rows is not None:
            replies = [head[0]] * with_progress + resp.parse(got[head[1] + rows.size:], 1)
            plain = np.ascontiguousarray(rows[:, plan.plain_bytes]).view("<f8")
            width = plan.ring_floats[-1] * VALUE_BYTES
            rings = np.frombuffer(self._scratch_buffer("rings", n * width), np.uint8, n * width).reshape(n, width)
            for (at, size), into in zip(plan.ring_bytes, plan.ring_floats[:-1], strict=True):
                rings[:, into * VALUE_BYTES:into * VALUE_BYTES + size] = rows[:, at:at + size]
            rings = rings.view("<f8")
        else:
            replies = got if isinstance(got, list) else resp.parse(got, n_replies)
            plain, rings = _parsed_columns(replies[with_progress:with_progress + n], plan, prefix.decode())
        if replies[-1] != end[-2 - resp.NONCE_BYTES:-2]:
            raise redis.ConnectionError("Redis's replies are out of step with the read's commands")
        return _Chunk(plain, rings, _concatenated(replies[:1]) if with_progress else [None] * len(plan.tiled))

    def _scratch_buffer(self, name: str, size: int) -> bytearray:
        """This thread's buffer `name` of at least `size` bytes: the one kept from its earlier reads, or
        a new one (kept when small enough)."""
        buffer = getattr(self._scratch, name, None)
        if buffer is None or len(buffer) < size:
            buffer = bytearray(size)
            self._keep(name, buffer)
        return buffer

    def _keep(self, name: str, buffer: bytearray) -> None:
        if len(buffer) <= SCRATCH_KEPT_BYTES:
            setattr(self._scratch, name, buffer)

    def _progress_command(self, plan: _ReadPlan) -> bytes:
        fields = [tiles_field(h).encode() for h, _ in plan.tiled]
        return (b"*%d\r\n$5\r\nHMGET\r\n" % (len(fields) + 2)
                + bulk_strings([progress_key(self.prefix).encode(), *fields]))

    def _round_trip(self, payload: Sequence[bytes], n_replies: int) -> list[Any]:
        """Pre-encoded commands out on one pooled connection, their `n_replies` replies back (an error
        reply as an exception object)."""
        with self._connection() as connection:
            connection.send_packed_command(payload)
            return resp.each_reply(connection, n_replies)

    def _round_trip_raw(self, payload: bytes, end: bytes, n_replies: int, size_hint: int) -> memoryview | list[Any]:
        """Pre-encoded commands ending in `resp.end_marker`'s out on one pooled connection: the bytes
        back through `end` (about `size_hint`; a view of this thread's receive buffer, valid until its
        next read), or where the socket is out of reach, the `n_replies` replies."""
        with self._connection() as connection:
            connection.send_packed_command([payload])
            got = resp.read_through(connection, end, self._scratch_buffer("received", size_hint + resp.FEED_BYTES))
            if got is None:
                return resp.each_reply(connection, n_replies)
        received, n = got
        self._keep("received", received)  # grown by read_through beyond the hint
        return memoryview(received)[:n]

    @contextlib.contextmanager
    def _connection(self) -> Iterator[redis.Connection]:
        pool = self.client.connection_pool
        connection = pool.get_connection()
        try:
            yield connection
        except BaseException:
            connection.disconnect()  # unread replies must not answer the next caller's command
            raise
        finally:
            pool.release(connection)


@dataclass(frozen=True)
class _Chunk:
    plain: np.ndarray
    rings: np.ndarray  # [entity, floats of every ring]: ring r at _ReadPlan.ring_floats[r]
    progress: list[bytes | None]


@functools.cache
def _slot_template(horizon_s: int) -> tuple[np.ndarray, np.ndarray]:
    """The RESP arguments of one slot of `horizon_s` (field, value, field, value...) with zeros for the
    values, and the byte offset of each value in it."""
    template, value_at = b"", []
    for field in _slot_fields(horizon_s):
        template += bulk_strings([field.encode()]) + b"$%d\r\n" % VALUE_BYTES
        value_at.append(len(template))
        template += bytes(VALUE_BYTES) + b"\r\n"
    return np.frombuffer(template, dtype=np.uint8), np.array(value_at)[:, None]


def merge_rings(tiles: np.ndarray, horizons_s: Sequence[int], as_of_ms: Sequence[float | None],
                ) -> tuple[np.ndarray, np.ndarray]:
    """Each entity's horizons from its rings `tiles` [entity, ring, tile, window end + TILE_VALUES] of
    the horizons `horizons_s`: per ring, the tiles ending in (as_of - horizon, as_of] added up, ratios
    from the sums, distinct counterparts the most of any tile. An `as_of_ms` of None (no progress
    written) takes each entity's newest tile end in that ring. Returns the values [entity, ring,
    _MERGED], NaN for an entity with no tile in a ring, and the window end (as_of) [entity, ring],
    UNKNOWN_WINDOW_END for those. All rings in one pass: each numpy call costs microseconds at a
    hundred entities.

    >>> ring = np.zeros((2, 1, 3, 9)); ring[0, 0, :, 0] = [3000, 6000, 9000]; ring[0, 0, :, 1] = [1, 2, 4]
    >>> ring[0, 0, :, 2] = [1, 0, 1]; ring[0, 0, :, 8] = [3, 1, 2]
    >>> merged, ends = merge_rings(np.concatenate([ring, ring], axis=1), [6, 9], [9000.0, None])
    >>> merged[..., _MERGED.index("impressions")].tolist(), ends.tolist()
    ([[6.0, 7.0], [nan, nan]], [[9000, 9000], [-1, -1]])
    >>> round(float(merged[0, 0, _MERGED.index("ctr")]), 3), merged[:, 0, _MERGED.index(DISTINCT)].tolist()
    (0.167, [2.0, nan])
    """
    ends = np.ascontiguousarray(tiles[..., 0])  # compared three times: strided, each took longer than the copy
    as_of = np.array([np.nan if a is None else a for a in as_of_ms])
    if np.isnan(as_of).any():
        as_of = np.where(np.isnan(as_of), ends.max(axis=2), as_of)  # [entity, ring]
    as_of = np.broadcast_to(as_of, ends.shape[:2])[..., None]
    since = as_of - np.asarray(horizons_s, dtype=np.float64)[:, None] * 1000
    weights = ((ends > since) & (ends <= as_of)).astype(np.float64)
    merged = np.empty((*tiles.shape[:2], len(_MERGED)))
    # a weighted sum over the tiles: no masked copy of the rings (it was most of a read's numpy time)
    np.matmul(weights[..., None, :], tiles[..., 1:], out=merged[..., None, :len(TILE_VALUES)])
    merged[..., _DISTINCT - 1] = (tiles[..., _DISTINCT] * weights).max(axis=2)  # counts are >= 0
    for ratio, (numerator, denominator) in _RATIOS.items():
        merged[..., ratio] = 0.0
        np.divide(merged[..., numerator], merged[..., denominator], out=merged[..., ratio],
                  where=merged[..., denominator] > 0)
    known = (ends > 0).any(axis=2)
    merged[~known] = np.nan
    return merged, np.where(known, as_of[..., 0], UNKNOWN_WINDOW_END).astype(np.int64)


def distinct_counts(tiles: np.ndarray, sketches: Sequence[Sequence[bytes | None]], horizon_s: int,
                    as_of_ms: float | None) -> np.ndarray:
    """Each entity's distinct counterparts over the horizon: its ring `tiles` [entity, tile, window end +
    TILE_VALUES] and the sketch at each ring position (feature_store.keys), over the tiles that
    `merge_rings` adds up. While no tile kept only its smallest hashes (it saw more ids than its sketch
    holds), the union of the tiles' hashes is the horizon's, and the count exact. Else, below theta, the
    smallest largest hash of such a tile, the union holds every hash of the horizon, and their number
    divided by theta / 2**63 estimates the count: a theta sketch's estimate, unbiased, with a relative
    error near 1/sqrt(that number), at least the sketch size. A tile without its sketch (written by
    an earlier job, or replaced since the ring was read) adds nothing to the union, and the answer is
    never below the most of any one tile, which was the whole answer before the sketches. NaN for an
    entity with no tile. Every entity at once, in numpy.

    >>> ring = np.zeros((2, 3, 9)); ring[0, :, 0] = [3000, 6000, 9000]; ring[0, :, 8] = [2, 2, 1]
    >>> sk = [struct.pack("<d", e) + (np.array(h, "<i8") << 40).tobytes() for e, h in ((3000, [5, 9]), (6000, [1, 9]))]
    >>> distinct_counts(ring, [[*sk, None], [None] * 3], 9, 9000.0).tolist()
    [3.0, nan]
    >>> distinct_counts(ring, [[*sk, None], [None] * 3], 6, 9000.0).tolist()
    [2.0, nan]
    """
    n, ring = tiles.shape[:2]
    ends, counts = tiles[:, :, 0], tiles[:, :, _DISTINCT]
    as_of = ends.max(axis=1, keepdims=True) if as_of_ms is None else np.float64(as_of_ms)
    inside = ((ends > as_of - horizon_s * 1000) & (ends <= as_of)).reshape(-1)
    lower = np.where(inside.reshape(n, ring), counts, 0.0).max(axis=1, initial=0.0)
    # one buffer of 8-byte words: per sketch its window end, then its hashes (8 zero bytes after them)
    pieces = [b"" if v is None or len(v) <= 8 or len(v) % 8 else v for row in sketches for v in row]
    size = np.fromiter(map(len, pieces), dtype=np.int64, count=n * ring) // 8
    pieces.append(bytes(8))
    words = np.frombuffer(b"".join(pieces), dtype="<i8")
    start = np.cumsum(size) - size
    valid = (size > 0) & inside & (words.view("<f8")[start] == ends.reshape(-1))
    hashes = np.where(valid, size - 1, 0)
    entity = np.repeat(np.arange(n), ring)
    cut = valid & (hashes < counts.reshape(-1))  # the tile kept its smallest hashes only
    theta = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(theta, entity[cut], words[(start + size - 1)[cut]])
    has_cut = np.bincount(entity[cut], minlength=n) > 0
    # every hash of a valid sketch (a sketch's words are contiguous, an entity's sketches too), keyed
    # by its entity and its top 49 bits: one sort of that key (a sort by two keys took about four times
    # as long); two of an entity's ids share those bits with odds near n**2 / 2**50
    taken = np.repeat(valid, size)
    taken[start[size > 0]] = False  # the window ends
    shift, bits = 63 - _ENTITY_BITS, _ENTITY_BITS
    entity_bits = np.repeat(np.arange(n, dtype=np.int64) << shift, size.reshape(n, ring).sum(axis=1))
    key = np.right_shift(words[:-1], bits)
    key = np.bitwise_or(key, entity_bits, out=key)[taken]  # in place: one temporary megabyte fewer
    key.sort()
    if len(key):
        first = np.empty(len(key), dtype=bool)
        first[0] = True
        np.not_equal(key[1:], key[:-1], out=first[1:])
        key = key[first]
    # an entity's hashes are a run of the sorted keys: counted by where the runs and theta fall
    entity_from = np.searchsorted(key, np.arange(n + 1, dtype=np.int64) << shift)
    union = np.diff(entity_from).astype(np.float64)
    below = (np.searchsorted(key, np.arange(n, dtype=np.int64) << shift | theta >> bits)
             - entity_from[:-1]).astype(np.float64)
    estimate = np.divide(below, theta / 2.0**63, out=np.zeros(n), where=has_cut & (theta > 0))
    counted = np.where(has_cut, np.maximum(estimate, below + 1), union)
    got = np.maximum(np.where(union > 0, counted, 0.0), lower)
    got[~(ends > 0).any(axis=1)] = np.nan
    return got


_ENTITY_BITS = 14  # a send's entities (ENTITIES_PER_SEND) fit in these
_MERGED = (*TILE_VALUES, "ctr", "dwell_mean_ms")
DISTINCT = "distinct_counterparts"
_DISTINCT = 1 + TILE_VALUES.index("distinct_counterparts")  # in a tile, after its window end
_RATIOS = {_MERGED.index("ctr"): (TILE_VALUES.index("clicks"), TILE_VALUES.index("impressions")),
           _MERGED.index("dwell_mean_ms"): (TILE_VALUES.index("dwell_sum_ms"), TILE_VALUES.index("dwell_count"))}


def tile_layout(flink: FlinkSettings) -> dict[int, int]:
    """The horizons the feature job of `flink` writes as tiles, with their tile length (s): those whose
    window hops (flink.horizon_slides_s, else the base window), the feature set's by default.

    >>> tile_layout(FlinkSettings()), tile_layout(FlinkSettings(horizons_s=(60,), horizon_slides_s={60: 60}))
    ({60: 3, 600: 30}, {})
    """
    tiles = {}
    for horizon in flink.horizons_s or HORIZONS_S:
        tile = flink.hop_s(horizon)
        if tile < horizon:
            if horizon % tile:
                raise ValueError(f"flink.horizon_slides_s: {tile} s does not divide the horizon of {horizon} s")
            tiles[horizon] = tile
    return tiles


@dataclass(frozen=True)
class _ReadPlan:
    """What one list of feature names turns into on the wire, worked out once per list."""

    width: int  # fields per entity: the plain names, one window end per plain horizon, one ring per tiled one
    plain_width: int  # the fields before the rings
    tiled: list[tuple[int, int]]  # (horizon, tiles per ring) per ring read
    # where each name's value comes from, as numpy indices: the names of plain fields (plain_out) from
    # plain columns (plain_in) with their horizon's window end (plain_end_in); those of rings (tiled_out)
    # from the merged rings [entity, ring * len(_MERGED)] (tiled_in) of ring tiled_ring; a name no tile
    # keeps (unknown_out) reads NaN with its ring's window end
    plain_out: np.ndarray
    plain_in: np.ndarray
    plain_end_in: np.ndarray
    tiled_out: np.ndarray
    tiled_in: np.ndarray
    tiled_ring: np.ndarray
    unknown_out: np.ndarray
    unknown_ring: np.ndarray
    distinct_rings: list[int]  # the rings whose distinct counterparts are read (their sketches too)
    ring_floats: list[int]  # where each ring starts in _Chunk.rings, and their end
    fields: list[str]
    head: bytes  # RESP before the key
    tail: bytes  # RESP after the key: the fields
    layout: RowLayout  # an entity's reply when every field is there
    plain_bytes: np.ndarray  # in that reply, the bytes of the plain fields' values, in order
    ring_bytes: list[tuple[int, int]]  # and each ring's offset and length


@functools.cache
def _slot_fields(horizon_s: int) -> tuple[str, ...]:
    """The fields of one (entity, horizon) slot, in the order the writer packs them."""
    return (window_end_field(horizon_s), *(field_name(horizon_s, name) for name in VALUE_FIELDS))


@functools.lru_cache(maxsize=64)
def _read_plan(names: tuple[str, ...], tiles_s: tuple[tuple[int, int], ...]) -> _ReadPlan:
    tile_of = dict(tiles_s)
    parsed = [split_feature_name(n) for n in names]
    plain = [n for n, (h, _) in zip(names, parsed, strict=True) if h not in tile_of]
    plain_horizons = sorted({h for h, _ in parsed if h not in tile_of})
    tiled = sorted({h for h, _ in parsed if h in tile_of})
    fields = [*plain, *(window_end_field(h) for h in plain_horizons)]
    plain_width = len(fields)
    fields += [tiles_field(h) for h in tiled]
    plain_cols, tiled_cols, unknown_cols = [], [], []
    for column, (name, (horizon, feature)) in enumerate(zip(names, parsed, strict=True)):
        if horizon not in tile_of:
            plain_cols.append((column, plain.index(name), len(plain) + plain_horizons.index(horizon)))
        elif feature in _MERGED:
            r = tiled.index(horizon)
            tiled_cols.append((column, r * len(_MERGED) + _MERGED.index(feature), r))
        else:
            unknown_cols.append((column, tiled.index(horizon)))
    tail = b"".join(b"$%d\r\n%s\r\n" % (len(f), f) for f in (f.encode() for f in fields))
    rings = [(h, h // tile_of[h]) for h in tiled]
    layout = RowLayout.of([VALUE_BYTES] * plain_width + [ring * TILE_BYTES for _, ring in rings])
    plain_bytes = (np.array(layout.value_at[:plain_width], dtype=np.intp)[:, None]
                   + np.arange(VALUE_BYTES)).reshape(-1)
    ring_bytes = [(at, ring * TILE_BYTES) for at, (_, ring) in zip(layout.value_at[plain_width:], rings, strict=True)]
    plain_out, plain_in, plain_end_in = np.array(plain_cols, dtype=np.intp).reshape(-1, 3).T
    tiled_out, tiled_in, tiled_ring = np.array(tiled_cols, dtype=np.intp).reshape(-1, 3).T
    unknown_out, unknown_ring = np.array(unknown_cols, dtype=np.intp).reshape(-1, 2).T
    return _ReadPlan(
        width=len(fields), plain_width=plain_width, tiled=rings,
        plain_out=plain_out, plain_in=plain_in, plain_end_in=plain_end_in,
        tiled_out=tiled_out, tiled_in=tiled_in, tiled_ring=tiled_ring,
        unknown_out=unknown_out, unknown_ring=unknown_ring,
        distinct_rings=sorted({tiled.index(h) for h, feature in parsed if h in tile_of and feature == DISTINCT}),
        ring_floats=[0, *np.cumsum([ring * TILE_FLOATS for _, ring in rings]).tolist()], fields=fields,
        head=b"*%d\r\n$5\r\nHMGET\r\n" % (len(fields) + 2), tail=tail, layout=layout, plain_bytes=plain_bytes,
        ring_bytes=ring_bytes)


def _merged_rings(rings: np.ndarray, plan: _ReadPlan, as_of_ms: list[float | None]) -> tuple[np.ndarray, np.ndarray]:
    """`merge_rings` of a read's rings [entity, floats of every ring]: in one pass when the rings are
    alike (the default horizons: 20 tiles each), else ring by ring."""
    n, horizons, lengths = len(rings), [h for h, _ in plan.tiled], {ring for _, ring in plan.tiled}
    if len(lengths) == 1:
        return merge_rings(rings.reshape(n, len(horizons), lengths.pop(), TILE_FLOATS), horizons, as_of_ms)
    parts = [merge_rings(_ring_tiles(rings, plan, r)[:, None], [horizon], [as_of_ms[r]])
             for r, (horizon, _) in enumerate(plan.tiled)]
    return np.concatenate([m for m, _ in parts], axis=1), np.concatenate([e for _, e in parts], axis=1)


def _ring_tiles(rings: np.ndarray, plan: _ReadPlan, r: int) -> np.ndarray:
    """Ring r of a read's rings [entity, floats of every ring], as [entity, tile, TILE_FLOATS] (a view)."""
    return rings[:, plan.ring_floats[r]:plan.ring_floats[r + 1]].reshape(len(rings), plan.tiled[r][1], TILE_FLOATS)


@functools.lru_cache(maxsize=64)
def _before_key(head: bytes, prefix: bytes) -> Callable[[int], bytes]:
    """The RESP of an HMGET up to the key's id, for an id of a given length (cached per length)."""
    return functools.cache(lambda length: b"%s$%d\r\n%s" % (head, len(prefix) + length, prefix))


def _parsed_columns(replies: list[Any], plan: _ReadPlan, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """The entities' replies, parsed one by one, as `_read_chunk`'s plain values and rings."""
    flat, n = _concatenated(replies), len(replies)
    plain = _float64s([flat[c::plan.width] for c in range(plan.plain_width)], VALUE_BYTES, prefix)
    rings = [_float64s([flat[plan.plain_width + r::plan.width]], ring * TILE_BYTES, prefix).reshape(n, -1)
             for r, (_, ring) in enumerate(plan.tiled)]
    return plain.reshape(plan.plain_width, n).T, np.concatenate([np.empty((n, 0)), *rings], axis=1)


def _float64s(columns: list[list[bytes | None]], size: int, prefix: str) -> np.ndarray:
    """The replies of `columns`, each `size` bytes of float64s (a missing one: NaNs, or for a ring
    zeros, a tile never written), concatenated into one flat array."""
    flat = [v for column in columns for v in column]
    try:
        joined = b"".join(flat)  # type: ignore[arg-type]
    except TypeError:  # a missing value (None): rarer than not, so only then looked for
        missing = PACKED_NAN if size == VALUE_BYTES else bytes(size)
        joined = b"".join([missing if v is None else v for v in flat])
    if len(joined) != len(flat) * size:
        raise ValueError(f"values under {prefix}* are not what this store writes ({size}-byte float64 fields): "
                         "written by another version of it, or with other flink.horizon_slides_s? Use a new "
                         "redis.key_prefix or let the old keys expire (redis.ttl_s)")
    return np.frombuffer(joined, dtype="<f8")


def _without_errors(replies: list[Any]) -> list[list[bytes | None]]:
    """Array replies as they are; an error reply raised."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise redis.ResponseError(str(reply))
    return replies


def _concatenated(replies: list[Any]) -> list[bytes | None]:
    """Array replies, concatenated; an error reply raised."""
    return [value for reply in _without_errors(replies) for value in reply]
