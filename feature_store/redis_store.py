"""Redis implementation of the online store (see keys.py for the layout).

Writes go through one pipeline per batch, one server-side script call per 500 (entity, horizon)
slots: the script replaces a slot only when the incoming window ends at or after the stored one, so
replays, restarts and backfills never overwrite newer values. Inside a batch the newest window per
slot is picked before anything is sent.

Every value is stored as 8 bytes, a little-endian float64: a read turns the replies into a matrix
with one `np.frombuffer`, where decimal text cost a parse per value, and Redis answers faster too
(it keeps short decimal strings as integers and formats them back on every read). Reads are plain
HMGETs, one per entity, sent as one pre-encoded pipeline and parsed by hiredis straight off the
socket; redis-py's pipeline builds and parses each command in Python, at about the cost of Redis's
own work.
"""

from __future__ import annotations

import functools
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
from feature_store.keys import (
    RECENT_FIELD,
    RECENT_HORIZON_S,
    entity_key,
    entity_key_prefix,
    field_name,
    split_feature_name,
    window_end_field,
)
from schemas.registry import field_names

# Which FeatureRecord fields name the slot and its window, which carry a user's recent engagements
# (horizon 0 only); every other field is a stored value.
SLOT_FIELDS = ("entity_type", "entity_id", "horizon_s", "window_start", "window_end")
RECENT_FIELDS = ("recent_items", "recent_types", "recent_times_ms")
VALUE_FIELDS = tuple(f for f in field_names("FeatureRecord") if f not in SLOT_FIELDS + RECENT_FIELDS)

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
VALUE_BYTES = 8
PACKED_NAN = np.float64(np.nan).tobytes()
SLOTS_PER_CALL = 500
ENTITIES_PER_SEND = 10_000  # bounds the request and reply held in memory at once


def latest_per_slot(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Keeps, per (entity_type, entity_id, horizon), the record with the latest window end.

    >>> rs = [{"entity_type": "u", "entity_id": "1", "horizon_s": 3, "window_end": t} for t in (6, 9, 3)]
    >>> [r["window_end"] for r in latest_per_slot(rs)]
    [9]
    """
    best: dict[tuple[str, str, int], Mapping[str, Any]] = {}
    for r in records:
        slot = (r["entity_type"], r["entity_id"], r["horizon_s"])
        kept = best.get(slot)
        if kept is None or r["window_end"] >= kept["window_end"]:
            best[slot] = r
    return list(best.values())


class RedisFeatureStore:
    """FeatureWriter and FeatureReader over one Redis database; the client is created on first use."""

    def __init__(self, url: str, key_prefix: str, ttl_s: int, connection: Mapping[str, Any] | None = None) -> None:
        """`connection`: what `redis.Redis.from_url` needs beyond the URL (ACL user, password, TLS files)."""
        self.url = url
        self.connection = dict(connection or {})
        self.prefix = key_prefix
        self.ttl_s = ttl_s
        self._client: redis.Redis | None = None
        self._script: Any = None

    @classmethod
    def from_settings(cls, redis_settings: RedisSettings) -> RedisFeatureStore:
        return cls(redis_settings.url, redis_settings.key_prefix, redis_settings.ttl_s,
                   redis_settings.connection_kwargs())

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = redis.Redis.from_url(self.url, **self.connection)
        return self._client

    def _writer(self) -> Any:
        if self._script is None:
            self._script = self.client.register_script(NEWEST_WINS)
        return self._script

    def write_batch(self, records: Sequence[Mapping[str, Any]]) -> int:
        latest = latest_per_slot(records)
        if not latest:
            return 0
        writer = self._writer()
        pipe = self.client.pipeline(transaction=False)
        lists = [r for r in latest if r["horizon_s"] == RECENT_HORIZON_S]
        if lists:
            latest = [r for r in latest if r["horizon_s"] != RECENT_HORIZON_S]
            self._queue_lists(writer, pipe, lists)
        width = 1 + len(VALUE_FIELDS)
        for start in range(0, len(latest), SLOTS_PER_CALL):
            chunk = latest[start:start + SLOTS_PER_CALL]
            keys = [entity_key(self.prefix, r["entity_type"], r["entity_id"]) for r in chunk]
            packed = np.array([[r["window_end"], *(r[name] for name in VALUE_FIELDS)] for r in chunk],
                              dtype="<f8").tobytes()
            args: list[Any] = [self.ttl_s, width]
            at = 0
            for r in chunk:
                for field in _slot_fields(r["horizon_s"]):
                    args += (field, packed[at:at + VALUE_BYTES])
                    at += VALUE_BYTES
            writer(keys=keys, args=args, client=pipe)
        try:
            results = pipe.execute()
        except redis.exceptions.NoScriptError:
            self._script = None
            return self.write_batch(records)
        return int(sum(results))

    def _queue_lists(self, writer: Any, pipe: Any, lists: Sequence[Mapping[str, Any]]) -> None:
        """Users' recent engagements into `pipe`, newest window wins as for the other slots."""
        end_field = window_end_field(RECENT_HORIZON_S)
        for start in range(0, len(lists), SLOTS_PER_CALL):
            chunk = lists[start:start + SLOTS_PER_CALL]
            args: list[Any] = [self.ttl_s, 2]
            for r in chunk:
                listed = {"items": r["recent_items"] or [], "types": r["recent_types"] or [],
                          "times_ms": r["recent_times_ms"] or []}
                args += (end_field, struct.pack("<d", r["window_end"]), RECENT_FIELD,
                         json.dumps(listed, separators=(",", ":")))
            writer(keys=[entity_key(self.prefix, r["entity_type"], r["entity_id"]) for r in chunk], args=args,
                   client=pipe)

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
        pool = self.client.connection_pool
        connection = pool.get_connection()
        try:
            connection.send_packed_command([payload])
            return _read_replies(connection, len(ids))
        except BaseException:
            connection.disconnect()  # unread replies must not answer the next caller's command
            raise
        finally:
            pool.release(connection)


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


def _read_replies(connection: redis.Connection, n: int) -> list[bytes | None]:
    """The next `n` array replies, concatenated. Parsed straight off the socket by hiredis: redis-py's
    per-reply read_response costs about as much as Redis takes to answer."""
    sock = getattr(connection, "_sock", None)
    if sock is None:  # a redis-py without the private socket: its own parser, slower, same replies
        flat: list[bytes | None] = []
        for _ in range(n):
            flat += connection.read_response()
        return flat
    reader = hiredis.Reader()
    flat = []
    while n:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise redis.ConnectionError("Redis closed the connection during a read")
        reader.feed(chunk)
        while n:
            reply = reader.gets()
            if reply is False:
                break
            if isinstance(reply, Exception):
                raise redis.ResponseError(str(reply))
            flat += reply
            n -= 1
    return flat
