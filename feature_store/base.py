"""Interfaces of the online store, so callers and tests can swap implementations."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

UNKNOWN_WINDOW_END = -1


@dataclass(frozen=True)
class OnlineFeatures:
    """Values per entity and name, NaN where unknown, and per value the end (epoch ms) of the window
    it describes, UNKNOWN_WINDOW_END where unknown: a feature's age is now minus its window end. The
    arrays may be read-only views of the store's reply buffer; copy before writing into them.

    >>> f = OnlineFeatures(["60s.ctr"], np.array([[0.25], [np.nan]]), np.array([[9000], [-1]]))
    >>> f.entity(0), f.entity(1)
    (({'60s.ctr': 0.25}, {'60s.ctr': 9000}), ({'60s.ctr': None}, {'60s.ctr': None}))
    """

    names: list[str]
    values: np.ndarray  # float64 [entity, name]
    window_end_ms: np.ndarray  # int64 [entity, name]

    def entity(self, i: int) -> tuple[dict[str, float | None], dict[str, int | None]]:
        """Row `i` as plain dicts, None where unknown (for JSON and people)."""
        values = {n: None if np.isnan(v) else float(v) for n, v in zip(self.names, self.values[i], strict=True)}
        ends = {n: None if e == UNKNOWN_WINDOW_END else int(e)
                for n, e in zip(self.names, self.window_end_ms[i], strict=True)}
        return values, ends


class FeatureWriter(Protocol):
    def write_batch(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Writes FeatureRecords; returns how many (entity, horizon) slots were updated."""


class FeatureReader(Protocol):
    def get_online_features(self, entity_type: str, ids: Sequence[str], names: Sequence[str]) -> OnlineFeatures: ...
