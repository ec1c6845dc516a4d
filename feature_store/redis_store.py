"""Redis implementation of the online store (see keys.py for the layout).

Writes go out as one request per batch, one server-side script call per 500 (entity, horizon)
slots: the script replaces a slot only when the incoming window ends at or after the stored one, so
replays, restarts and backfills never overwrite newer values. Inside a batch the newest window per
slot is picked before anything is sent. The request's bytes are built column by column (a batch
decoded in bulk, `schemas.bulk`, needs no record objects): every slot of one horizon has the same
field names, so its arguments are one fixed template with the values copied in, where redis-py's
pipeline encoded each of twenty arguments per slot in Python.

Every value is stored as 8 bytes, a little-endian float64: a read turns the replies into a matrix
with one `np.frombuffer`, where decimal text cost a parse per value, and Redis answers faster too
(it keeps short decimal strings as integers and formats them back on every read). Reads are plain
HMGETs, one per entity, sent as one pre-encoded pipeline and parsed by hiredis straight off the
socket; redis-py's pipeline builds and parses each command in Python, at about the cost of Redis's
own work.
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import hiredis
import numpy as np
import redis

from core.settings import RedisSettings
from feature_store.base import UNKNOWN_WINDOW_END, OnlineFeatures, RecentEngagements
from feature_store.columns import VALUE_FIELDS, FeatureColumns
from feature_store.keys import (
    RECENT_FIELD,
    RECENT_HORIZON_S,
    entity_key,
    entity_key_prefix,
    field_name,
    split_feature_name,
    window_end_field,
)

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
VALUE_BYTES = 8
PACKED_NAN = np.float64(np.nan).tobytes()
SLOTS_PER_CALL = 500
ENTITIES_PER_SEND = 10_000  # bounds the request and reply held in memory at once


class RedisFeatureStore:
    """FeatureWriter and FeatureReader over one Redis database; the client is created on first use."""

    def __init__(self, url: str, key_prefix: str, ttl_s: int, connection: Mapping[str, Any] | None = None) -> None:
        """`connection`: what `redis.Redis.from_url` needs beyond the URL (ACL user, password, TLS files)."""
        self.url = url
        self.connection = dict(connection or {})
        self.prefix = key_prefix
        self.ttl_s = ttl_s
        self._client: redis.Redis | None = None

    @classmethod
    def from_settings(cls, redis_settings: RedisSettings) -> RedisFeatureStore:
        return cls(redis_settings.url, redis_settings.key_prefix, redis_settings.ttl_s,
                   redis_settings.connection_kwargs())

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
        horizons = batch.horizon_s[rows]
        commands: list[bytes] = []
        for horizon in np.unique(horizons).tolist():
            of_horizon = rows[horizons == horizon]
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

    def _lists_command(self, batch: FeatureColumns, rows: np.ndarray, keys: list[bytes]) -> bytes:
        """One call of the script for users' recent engagements, newest window wins as for the other slots."""
        end_field, recent_field = window_end_field(RECENT_HORIZON_S).encode(), RECENT_FIELD.encode()
        parts: list[bytes] = []
        for row in rows.tolist():
            listed = json.dumps(batch.recent(row), separators=(",", ":")).encode()
            parts += (end_field, struct.pack("<d", batch.window_end[row]), recent_field, listed)
        return self._script_call(keys, [self.ttl_s, 2], _bulk_strings(parts), len(parts))

    def _script_call(self, keys: list[bytes], head_args: list[int], args: bytes, n_args: int) -> bytes:
        """EVALSHA of the newest-wins script in RESP: the keys, `head_args`, then `args` (already RESP)."""
        head = [str(a).encode() for a in head_args]
        return (b"*%d\r\n$7\r\nEVALSHA\r\n" % (3 + len(keys) + len(head) + n_args)
                + _bulk_strings([NEWEST_WINS_SHA, b"%d" % len(keys), *keys, *head]) + args)

    def _send_scripts(self, commands: list[bytes], loaded: bool = False) -> list[int]:
        """Sends the script calls in one round trip; their replies (slots replaced per call). A Redis that
        lost its scripts (restarted) gets the script again and every call again: replacing only by a
        newer or equal window end makes the second sending harmless."""
        replies = self._round_trip(commands, len(commands))
        errors = [r for r in replies if isinstance(r, Exception)]
        if not loaded and any(str(e).startswith("NOSCRIPT") for e in errors):
            self.client.script_load(NEWEST_WINS)
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
        plan = _read_plan(tuple(names))
        prefix = entity_key_prefix(self.prefix, entity_type)
        flat: list[bytes | None] = []
        for start in range(0, len(ids), ENTITIES_PER_SEND):
            flat += self._hmget_each(prefix.encode(), ids[start:start + ENTITIES_PER_SEND], plan)
        try:
            joined = b"".join(flat)  # type: ignore[arg-type]
        except TypeError:  # a missing value (None): rarer than not, so only then looked for
            joined = b"".join([PACKED_NAN if v is None else v for v in flat])
        if len(joined) != len(flat) * VALUE_BYTES:
            raise ValueError(f"values under {prefix}* are not 8-byte float64s: written by another version of "
                             "the store? Use a new redis.key_prefix or let the old keys expire (redis.ttl_s)")
        matrix = np.frombuffer(joined, dtype="<f8").reshape(len(ids), plan.width)
        ends = matrix[:, plan.end_columns]  # fancy indexing: a copy, writable
        ends[np.isnan(ends)] = UNKNOWN_WINDOW_END
        return OnlineFeatures(list(names), matrix[:, :len(names)], ends.astype(np.int64))

    def _hmget_each(self, prefix: bytes, ids: Sequence[str], plan: _ReadPlan) -> list[bytes | None]:
        """`HMGET prefix+id *fields` for every id in one round trip; None where a value is missing."""
        # one %-format per key: concatenating the parts copied the long field list several times
        payload = b"".join([b"%s$%d\r\n%s%s\r\n%s" % (plan.head, len(prefix) + len(e), prefix, e, plan.tail)
                            for e in (entity_id.encode() for entity_id in ids)])
        return _concatenated(self._round_trip([payload], len(ids)))

    def _round_trip(self, payload: Sequence[bytes], n_replies: int) -> list[Any]:
        """Pre-encoded commands out on one pooled connection, their `n_replies` replies back (an error
        reply as an exception object)."""
        pool = self.client.connection_pool
        connection = pool.get_connection()
        try:
            connection.send_packed_command(payload)
            return _each_reply(connection, n_replies)
        except BaseException:
            connection.disconnect()  # unread replies must not answer the next caller's command
            raise
        finally:
            pool.release(connection)


@functools.cache
def _slot_template(horizon_s: int) -> tuple[np.ndarray, np.ndarray]:
    """The RESP arguments of one slot of `horizon_s` (field, value, field, value...) with zeros for the
    values, and the byte offset of each value in it."""
    template, value_at = b"", []
    for field in _slot_fields(horizon_s):
        template += _bulk_strings([field.encode()]) + b"$%d\r\n" % VALUE_BYTES
        value_at.append(len(template))
        template += bytes(VALUE_BYTES) + b"\r\n"
    return np.frombuffer(template, dtype=np.uint8), np.array(value_at)[:, None]


def _bulk_strings(parts: Sequence[bytes]) -> bytes:
    return b"".join([b"$%d\r\n%s\r\n" % (len(p), p) for p in parts])


@dataclass(frozen=True)
class _ReadPlan:
    """What one list of feature names turns into on the wire, worked out once per list."""

    width: int  # fields per entity: the names, then one window end per horizon
    end_columns: list[int]  # per name, the column of its horizon's window end
    head: bytes  # RESP before the key
    tail: bytes  # RESP after the key: the fields


@functools.cache
def _slot_fields(horizon_s: int) -> tuple[str, ...]:
    """The fields of one (entity, horizon) slot, in the order the writer packs them."""
    return (window_end_field(horizon_s), *(field_name(horizon_s, name) for name in VALUE_FIELDS))


@functools.lru_cache(maxsize=64)
def _read_plan(names: tuple[str, ...]) -> _ReadPlan:
    parsed = [split_feature_name(n) for n in names]
    horizons = sorted({h for h, _ in parsed})
    fields = [*names, *(window_end_field(h) for h in horizons)]
    tail = b"".join(b"$%d\r\n%s\r\n" % (len(f), f) for f in (f.encode() for f in fields))
    return _ReadPlan(len(fields), [len(names) + horizons.index(h) for h, _ in parsed],
                     b"*%d\r\n$5\r\nHMGET\r\n" % (len(fields) + 2), tail)


def _concatenated(replies: list[Any]) -> list[bytes | None]:
    """Array replies, concatenated; an error reply raised."""
    flat: list[bytes | None] = []
    for reply in replies:
        if isinstance(reply, Exception):
            raise redis.ResponseError(str(reply))
        flat += reply
    return flat


def _each_reply(connection: redis.Connection, n: int) -> list[Any]:
    """The next `n` replies, an error reply as an exception object. Parsed straight off the socket by
    hiredis: redis-py's per-reply read_response costs about as much as Redis takes to answer."""
    sock = getattr(connection, "_sock", None)
    replies: list[Any] = []
    if sock is None:  # a redis-py without the private socket: its own parser, slower, same replies
        for _ in range(n):
            try:
                replies.append(connection.read_response())
            except redis.ResponseError as exc:
                replies.append(exc)
        return replies
    reader = hiredis.Reader()
    while len(replies) < n:
        try:
            chunk = sock.recv(1 << 20)
        except TimeoutError as exc:  # as redis-py's own reads: a retryable error, not an OSError
            raise redis.TimeoutError(f"reading from Redis: {exc}") from exc
        except OSError as exc:
            raise redis.ConnectionError(f"reading from Redis: {exc}") from exc
        if not chunk:
            raise redis.ConnectionError("Redis closed the connection during a read")
        reader.feed(chunk)
        while len(replies) < n:
            reply = reader.gets()
            if reply is False:
                break
            replies.append(reply)
    return replies
