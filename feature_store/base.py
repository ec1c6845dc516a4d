"""Interfaces of the online store, so callers and tests can swap implementations."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:  # columns imports the schemas; the interfaces need only the name
    from feature_store.columns import FeatureColumns

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


@dataclass(frozen=True)
class RecentEngagements:
    """A user's newest engagements, newest first, as the feature job last wrote them (as of `as_of_ms`,
    the end of the window they were written for: all of them are before it).

    >>> r = RecentEngagements(["i3", "i2", "i1"], ["click", "like", "click"], [9_000, 5_000, 1_000], 9_001)
    >>> r.before(10_000, length=2, lookback_ms=6_000)
    (['i3', 'i2'], ['click', 'like'], [1000, 5000])
    >>> r.before(5_000, length=10, lookback_ms=60_000)
    (['i1'], ['click'], [4000])
    """

    items: list[str]
    types: list[str]
    times_ms: list[int]
    as_of_ms: int

    def before(self, now_ms: int, length: int, lookback_ms: int) -> tuple[list[str], list[str], list[int]]:
        """Items, types and ages (ms) of at most `length` engagements strictly before `now_ms` and at
        most `lookback_ms` before it: the cut the samples get (flink.history_length, history_lookback_s)."""
        kept = [k for k, t in enumerate(self.times_ms) if t < now_ms and now_ms - t <= lookback_ms][:length]
        return ([self.items[k] for k in kept], [self.types[k] for k in kept],
                [now_ms - self.times_ms[k] for k in kept])


class FeatureWriter(Protocol):
    def write_batch(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Writes FeatureRecords; returns how many (entity, horizon) slots were updated."""

    def write_columns(self, batch: FeatureColumns) -> int:
        """The same for FeatureRecords as columns (a batch decoded in bulk)."""


class FeatureReader(Protocol):
    def get_online_features(self, entity_type: str, ids: Sequence[str], names: Sequence[str]) -> OnlineFeatures: ...

    def get_recent_engagements(self, user_ids: Sequence[str]) -> list[RecentEngagements | None]:
        """Per user, the newest list written (None: none, or expired)."""
