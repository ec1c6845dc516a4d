"""Redis implementation of the online store (see keys.py for the layout).

Writes go through one pipeline per batch, one server-side script call per (entity, horizon) slot:
the script replaces the slot only when the incoming window ends at or after the stored one, so
replays, restarts and backfills never overwrite newer values. Inside a batch the newest window per
slot is picked before anything is sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import redis

from feature_store.base import OnlineFeatures
from feature_store.keys import entity_key, field_name, split_feature_name, window_end_field

VALUE_FIELDS = ("impressions", "clicks", "likes", "carts", "orders", "ctr", "dwell_sum_ms", "dwell_mean_ms",
                "distinct_counterparts")

# KEYS[1] entity hash; ARGV: ttl_s, window-end field, window end, then field/value pairs.
NEWEST_WINS = """
local current = redis.call('HGET', KEYS[1], ARGV[2])
if current and tonumber(current) > tonumber(ARGV[3]) then return 0 end
local args = {ARGV[2], ARGV[3]}
for i = 4, #ARGV do args[#args + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(args))
if tonumber(ARGV[1]) > 0 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return 1
"""


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


def _to_float(raw: bytes | None) -> float | None:
    return None if raw is None else float(raw)


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
            self._script = self._client.register_script(NEWEST_WINS)
        return self._client

    def write_batch(self, records: Sequence[Mapping[str, Any]]) -> int:
        latest = latest_per_slot(records)
        if not latest:
            return 0
        client = self.client
        pipe = client.pipeline(transaction=False)
        for r in latest:
            h = r["horizon_s"]
            args: list[Any] = [self.ttl_s, window_end_field(h), r["window_end"]]
            for name in VALUE_FIELDS:
                args += [field_name(h, name), r[name]]
            self._script(keys=[entity_key(self.prefix, r["entity_type"], r["entity_id"])], args=args, client=pipe)
        try:
            results = pipe.execute()
        except redis.exceptions.NoScriptError:
            self._script = client.register_script(NEWEST_WINS)
            return self.write_batch(records)
        return int(sum(results))

    def get_online_features(self, entity_type: str, ids: Sequence[str], names: Sequence[str]) -> OnlineFeatures:
        parsed = [split_feature_name(n) for n in names]
        horizons = sorted({h for h, _ in parsed})
        fields = list(names) + [window_end_field(h) for h in horizons]
        pipe = self.client.pipeline(transaction=False)
        for entity_id in ids:
            pipe.hmget(entity_key(self.prefix, entity_type, entity_id), fields)
        rows = pipe.execute()
        values: list[list[float | None]] = []
        ends: list[list[int | None]] = []
        n = len(names)
        for row in rows:
            end_by_h = {h: (None if raw is None else int(raw)) for h, raw in zip(horizons, row[n:], strict=True)}
            values.append([_to_float(raw) for raw in row[:n]])
            ends.append([end_by_h[h] for h, _ in parsed])
        return OnlineFeatures(list(names), values, ends)
