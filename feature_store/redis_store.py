"""Redis implementation of the online store (see keys.py for the layout).

Writes go through one pipeline per batch, one server-side script call per 500 (entity, horizon)
slots: the script replaces a slot only when the incoming window ends at or after the stored one, so
replays, restarts and backfills never overwrite newer values. Inside a batch the newest window per
slot is picked before anything is sent.

Reads are plain HMGETs, one per entity, written to the socket as one pre-encoded pipeline and parsed
by hiredis; the replies become one float64 matrix. Building the commands in redis-py's pipeline, or
unpacking replies per value, cost more than Redis itself spends answering.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import redis

from feature_store.base import UNKNOWN_WINDOW_END, OnlineFeatures
from feature_store.keys import entity_key, field_name, split_feature_name, window_end_field

VALUE_FIELDS = ("impressions", "clicks", "likes", "carts", "orders", "ctr", "dwell_sum_ms", "dwell_mean_ms",
                "distinct_counterparts")

# Many slots per call. KEYS: the entity hashes. ARGV: ttl_s, n_fields, then per key: the window-end
# field, the window end, and n_fields field/value pairs. A slot is replaced only when the incoming
# window ends at or after the stored one. Returns how many slots were replaced.
NEWEST_WINS = """
local ttl = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local stride = 2 + 2 * n
local written = 0
for k = 1, #KEYS do
  local base = 2 + (k - 1) * stride
  local current = redis.call('HGET', KEYS[k], ARGV[base + 1])
  if not current or tonumber(current) <= tonumber(ARGV[base + 2]) then
    local args = {ARGV[base + 1], ARGV[base + 2]}
    for i = base + 3, base + stride do args[#args + 1] = ARGV[i] end
    redis.call('HSET', KEYS[k], unpack(args))
    if ttl > 0 then redis.call('EXPIRE', KEYS[k], ttl) end
    written = written + 1
  end
end
return written
"""

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

    def __init__(self, url: str, key_prefix: str, ttl_s: int) -> None:
        self.url = url
        self.prefix = key_prefix
        self.ttl_s = ttl_s
        self._client: redis.Redis | None = None
        self._script: Any = None

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = redis.Redis.from_url(self.url)
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
        for start in range(0, len(latest), SLOTS_PER_CALL):
            chunk = latest[start:start + SLOTS_PER_CALL]
            keys = [entity_key(self.prefix, r["entity_type"], r["entity_id"]) for r in chunk]
            args: list[Any] = [self.ttl_s, len(VALUE_FIELDS)]
            for r in chunk:
                h = r["horizon_s"]
                args += [window_end_field(h), r["window_end"]]
                for name in VALUE_FIELDS:
                    args += [field_name(h, name), r[name]]
            writer(keys=keys, args=args, client=pipe)
        try:
            results = pipe.execute()
        except redis.exceptions.NoScriptError:
            self._script = None
            return self.write_batch(records)
        return int(sum(results))

    def get_online_features(self, entity_type: str, ids: Sequence[str], names: Sequence[str]) -> OnlineFeatures:
        parsed = [split_feature_name(n) for n in names]
        horizons = sorted({h for h, _ in parsed})
        fields = list(names) + [window_end_field(h) for h in horizons]
        keys = [entity_key(self.prefix, entity_type, entity_id) for entity_id in ids]
        flat: list[bytes] = []
        for start in range(0, len(keys), ENTITIES_PER_SEND):
            flat += self._hmget_each(keys[start:start + ENTITIES_PER_SEND], fields)
        matrix = np.array(flat, dtype=np.float64).reshape(len(keys), len(fields))
        n = len(names)
        end_columns = [n + horizons.index(h) for h, _ in parsed]
        ends = np.nan_to_num(matrix[:, end_columns], nan=UNKNOWN_WINDOW_END).astype(np.int64)
        return OnlineFeatures(list(names), matrix[:, :n], ends)

    def _hmget_each(self, keys: Sequence[str], fields: Sequence[str]) -> list[bytes]:
        """`HMGET key *fields` for every key in one round trip; missing values come back as b"nan"."""
        tail = b"".join(b"$%d\r\n%s\r\n" % (len(f), f) for f in (f.encode() for f in fields))
        head = b"*%d\r\n$5\r\nHMGET\r\n" % (len(fields) + 2)
        payload = b"".join([head + b"$%d\r\n%s\r\n" % (len(k), k) + tail for k in (k.encode() for k in keys)])
        pool = self.client.connection_pool
        connection = pool.get_connection("HMGET")
        flat: list[bytes | None] = []
        try:
            connection.send_packed_command([payload])
            for _ in keys:
                flat += connection.read_response()
        except BaseException:
            connection.disconnect()  # unread replies must not answer the next caller's command
            raise
        finally:
            pool.release(connection)
        return [b"nan" if v is None else v for v in flat]
