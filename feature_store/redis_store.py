"""Redis implementation of the online store (see keys.py for the layout).

Writes go out as one request per batch, one server-side script call per 500 (entity, horizon)
slots: the script (`feature_store.newest_wins`) replaces a slot only when the incoming window ends
at or after the stored one, so replays, restarts and backfills never overwrite newer values. Inside
a batch the newest window per slot is picked before anything is sent. The request's bytes are built
column by column (a batch decoded in bulk, `schemas.bulk`, needs no record objects): every slot of
one horizon has the same field names, so its arguments are one fixed template with the values
copied in, where redis-py's pipeline encoded each of twenty arguments per slot in Python.

A tile of a longer horizon goes into its position of the entity's ring (`feature_store.keys`) by a
second script, which splices it into the field holding that position when it ends at or after the
tile there, and raises the horizon's progress. A read of such a horizon fetches the ring's fields and
adds its tiles up in numpy (`feature_store.tile_merge`).

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
import json
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from core.settings import FlinkSettings, RedisSettings
from feature_store import resp
from feature_store.base import UNKNOWN_WINDOW_END, OnlineFeatures, RecentEngagements
from feature_store.columns import FeatureColumns
from feature_store.keys import (
    RECENT_FIELD,
    RECENT_HORIZON_S,
    SLOT_BYTES,
    TILE_BYTES,
    TILES_PER_FIELD,
    VALUE_BYTES,
    entity_key,
    entity_key_prefix,
    progress_field,
    progress_key,
    ring_field_prefix,
    sketch_field,
    sketch_field_prefix,
    values_field,
    window_end_field,
)
from feature_store.newest_wins import NEWEST_WINS_SHA, SCRIPTS, TILES_NEWEST_WINS_SHA
from feature_store.read_plan import SLOT_FLOATS, ReadPlan, merged_rings, read_plan, ring_tiles
from feature_store.resp import bulk_strings
from feature_store.thread_connections import ThreadConnections
from feature_store.tile_merge import DISTINCT, MERGED_VALUES, distinct_counts
from schemas.feature_set import HORIZONS_S

PACKED_NAN = np.float64(np.nan).tobytes()
SLOTS_PER_CALL = 500
ENTITIES_PER_SEND = 10_000  # bounds the request and reply held in memory at once (< 2**tile_merge.ENTITY_BITS)
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
        self._connections = ThreadConnections()  # kept per thread between reads

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

    def unlink_matching(self, pattern: str, where: Callable[[bytes], bool] | None = None) -> int:
        """Unlinks the keys matching the glob `pattern` (and `where`, given the key), 10,000 a call;
        returns how many. For a run's own namespace (`Settings.namespaced`), whose keys would otherwise
        stay until their TTL."""
        unlinked, batch = 0, []
        for key in self.client.scan_iter(pattern, count=10_000):
            if where is None or where(key):
                batch.append(key)
            if len(batch) == 10_000:
                unlinked += self.client.unlink(*batch)
                batch.clear()
        return unlinked + (self.client.unlink(*batch) if batch else 0)

    def write_batch(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Writes FeatureRecords (dicts); returns how many slots were replaced."""
        return self.write_columns(FeatureColumns.of_records(records))

    def write_columns(self, batch: FeatureColumns) -> int:
        """Writes a batch of FeatureRecords as columns; returns how many slots were replaced."""
        if not len(batch):
            return 0
        batch = batch.with_listed_tiles()
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
        args[:, value_at:value_at + SLOT_BYTES] = np.ascontiguousarray(values, dtype="<f8").view(np.uint8)
        return self._script_call(keys, [self.ttl_s, 1], args.tobytes(), len(keys) * 2)

    def _tiles_commands(self, horizon_s: int, ring: int, rows: np.ndarray, positions: np.ndarray,
                        batch: FeatureColumns, keys: list[bytes]) -> list[bytes]:
        """Calls of the tiles script for tiles of one horizon and ring length."""
        head = [ring_field_prefix(horizon_s, ring).encode(), progress_field(horizon_s).encode(), b"%d" % ring,
                b"%d" % TILE_BYTES, b"%d" % TILES_PER_FIELD, sketch_field_prefix(horizon_s).encode()]
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
        plan = read_plan(tuple(names), tuple(sorted(self.tiles_s.items())))
        prefix = entity_key_prefix(self.prefix, entity_type).encode()
        values, ends = np.empty((len(ids), len(names))), np.empty((len(ids), len(names)), dtype=np.int64)
        as_of: list[float | None] = []
        for start in range(0, len(ids), ENTITIES_PER_SEND):
            part = ids[start:start + ENTITIES_PER_SEND]
            chunk = self._read_chunk(prefix, part, plan, not start)
            if not start:  # every send is merged as of the first one's progress
                as_of = _progress_ends(chunk.progress, plan)
            rows = slice(start, start + len(part))
            self._fill(values[rows], ends[rows], chunk, plan, as_of, prefix, part)
        return OnlineFeatures(list(names), values, ends)

    def _fill(self, values: np.ndarray, ends: np.ndarray, chunk: _Chunk, plan: ReadPlan,
              as_of: list[float | None], prefix: bytes, ids: Sequence[str]) -> None:
        """The values and window ends [entity, name] of one send's entities, from what `_read_chunk` got."""
        if len(plan.plain_out):
            values[:, plan.plain_out] = chunk.plain[:, plan.plain_in]
            values[:, plan.plain_unknown_out] = np.nan
            end = chunk.plain[:, plan.plain_end_in]
            ends[:, plan.plain_out] = np.where(np.isnan(end), UNKNOWN_WINDOW_END, end)
        if plan.tiled:
            merged, end = merged_rings(chunk.rings, plan, as_of)
            for r in plan.distinct_rings:
                merged[:, r, MERGED_VALUES.index(DISTINCT)] = self._distinct_counts(
                    prefix, ids, plan.tiled[r][0], ring_tiles(chunk.rings, plan, r), as_of[r])
            values[:, plan.tiled_out] = merged.reshape(len(ids), len(plan.tiled) * len(MERGED_VALUES))[:, plan.tiled_in]
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
        return read_plan(tuple(names), tuple(sorted(self.tiles_s.items()))).fields

    def _read_chunk(self, prefix: bytes, ids: Sequence[str], plan: ReadPlan, first: bool) -> _Chunk:
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
            for at, size, into in plan.ring_bytes:  # a slice per field: np.take by byte index was slower
                rings[:, into:into + size] = rows[:, at:at + size]
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

    def _progress_command(self, plan: ReadPlan) -> bytes:
        fields = [progress_field(h).encode() for h, _ in plan.tiled]
        return (b"*%d\r\n$5\r\nHMGET\r\n" % (len(fields) + 2)
                + bulk_strings([progress_key(self.prefix).encode(), *fields]))

    def _round_trip(self, payload: Sequence[bytes], n_replies: int) -> list[Any]:
        """Pre-encoded commands out on this thread's connection, their `n_replies` replies back (an error
        reply as an exception object)."""
        with self._connection() as connection:
            connection.send_packed_command(payload)
            return resp.each_reply(connection, n_replies)

    def _round_trip_raw(self, payload: bytes, end: bytes, n_replies: int, size_hint: int) -> memoryview | list[Any]:
        """Pre-encoded commands ending in `resp.end_marker`'s out on this thread's connection: the bytes
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

    def _connection(self) -> contextlib.AbstractContextManager[redis.Connection]:
        return self._connections.connection(self.client.connection_pool)


@dataclass(frozen=True)
class _Chunk:
    plain: np.ndarray
    rings: np.ndarray  # [entity, floats of every ring]: ring r at ReadPlan.ring_floats[r]
    progress: list[bytes | None]


@functools.cache
def _slot_template(horizon_s: int) -> tuple[np.ndarray, int]:
    """The RESP arguments of one slot of `horizon_s` (its field, its value) with zeros for the value,
    and the byte offset of the value in it."""
    template = bulk_strings([values_field(horizon_s).encode()]) + b"$%d\r\n" % SLOT_BYTES
    return np.frombuffer(template + bytes(SLOT_BYTES) + b"\r\n", dtype=np.uint8), len(template)


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


@functools.lru_cache(maxsize=64)
def _before_key(head: bytes, prefix: bytes) -> Callable[[int], bytes]:
    """The RESP of an HMGET up to the key's id, for an id of a given length (cached per length)."""
    return functools.cache(lambda length: b"%s$%d\r\n%s" % (head, len(prefix) + length, prefix))


def _progress_ends(progress: list[bytes | None], plan: ReadPlan) -> list[float | None]:
    """The newest tile end of each tiled horizon from the progress replies (None: no tile yet); a ring
    of another length than the read's raises (its tiles are other fields)."""
    ends: list[float | None] = []
    for value, (horizon, ring) in zip(progress, plan.tiled, strict=True):
        if value is None:
            ends.append(None)
            continue
        end, *written_ring = np.frombuffer(value, dtype="<f8")
        if written_ring and written_ring[0] != ring:
            raise ValueError(f"the {horizon} s horizon is written as a ring of {int(written_ring[0])} tiles, and this "
                             f"reader expects {ring}: both must have the same flink.horizon_slides_s")
        ends.append(float(end))
    return ends


def _parsed_columns(replies: list[Any], plan: ReadPlan, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """The entities' replies, parsed one by one, as `_read_chunk`'s plain values and rings."""
    flat, n = _concatenated(replies), len(replies)
    plain = [_float64s(flat[c::plan.width], PACKED_NAN * SLOT_FLOATS, prefix).reshape(n, -1)
             for c in range(plan.plain_width)]
    tiles = [_float64s(flat[plan.plain_width + c::plan.width], bytes(size), prefix).reshape(n, -1)
             for c, (_, size, _) in enumerate(plan.ring_bytes)]
    return np.concatenate([np.empty((n, 0)), *plain], axis=1), np.concatenate([np.empty((n, 0)), *tiles], axis=1)


def _float64s(flat: list[bytes | None], missing: bytes, prefix: str) -> np.ndarray:
    """The replies `flat`, each as many bytes of float64s as `missing` (what a missing one reads as: NaNs
    for a window, zeros for a ring, a tile never written), concatenated into one flat array."""
    size = len(missing)
    try:
        joined = b"".join(flat)  # type: ignore[arg-type]
    except TypeError:  # a missing value (None): rarer than not, so only then looked for
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
