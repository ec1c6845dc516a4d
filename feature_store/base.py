"""Interfaces of the online store, so callers and tests can swap implementations."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class OnlineFeatures:
    """Values per entity (None where unknown) and, per value, the end of its window (feature age)."""

    names: list[str]
    values: list[list[float | None]]  # [entity][name]
    window_end_ms: list[list[int | None]]  # [entity][name]


class FeatureWriter(Protocol):
    def write_batch(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Writes FeatureRecords; returns how many (entity, horizon) slots were updated."""


class FeatureReader(Protocol):
    def get_online_features(self, entity_type: str, ids: Sequence[str], names: Sequence[str]) -> OnlineFeatures: ...
