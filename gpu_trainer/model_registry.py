"""Which snapshot is current: a version pointer in Redis beside the snapshots on disk.

>>> model_pointer_key("rtrec")
'rtrec:model:current'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis

from core.settings import RedisSettings, TrainerSettings
from gpu_trainer.snapshots import SnapshotError, SnapshotStore


def model_pointer_key(prefix: str) -> str:
    """Where the trainer publishes the current model version."""
    return f"{prefix}:model:current"


@dataclass
class SnapshotRow:
    version: int
    created_at: int
    samples_seen: int
    auc: float | None
    logloss: float | None
    promoted: bool
    current: bool


class ModelRegistry:
    def __init__(self, store: SnapshotStore, redis_url: str, key_prefix: str,
                 connection: Mapping[str, Any] | None = None) -> None:
        self.store = store
        self.key = model_pointer_key(key_prefix)
        self._url = redis_url
        self._connection = dict(connection or {})  # ACL user, password, TLS files (RedisSettings)
        self._client: redis.Redis | None = None

    @classmethod
    def from_settings(cls, trainer: TrainerSettings, redis_settings: RedisSettings) -> ModelRegistry:
        return cls(SnapshotStore(trainer.snapshot_dir), redis_settings.url, redis_settings.key_prefix,
                   redis_settings.connection_kwargs())

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = redis.Redis.from_url(self._url, **self._connection)
        return self._client

    def current_version(self) -> int | None:
        raw = self.client.get(self.key)
        return None if raw is None else int(raw)

    def set_current(self, version: int) -> None:
        self.client.set(self.key, version)

    def rollback(self, to_version: int) -> int | None:
        """Points `current` at an existing, intact snapshot; returns the previous current version."""
        self.store.load(to_version)  # raises SnapshotError when missing or corrupted
        previous = self.current_version()
        self.set_current(to_version)
        return previous

    def rows(self) -> list[SnapshotRow]:
        current = self.current_version()
        out = []
        for v in self.store.versions():
            try:
                m = self.store.manifest(v)
            except SnapshotError:
                continue
            out.append(SnapshotRow(v, m.created_at, m.samples_seen, m.metrics.get("auc"), m.metrics.get("logloss"),
                                   m.promoted, v == current))
        return out
