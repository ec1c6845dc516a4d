"""A batch of FeatureRecords as columns: what the Redis writer reads, from a bulk-decoded batch
(`schemas.bulk`) without a record object per row, or from records.

>>> batch_rows = [
...     {"entity_type": "user", "entity_id": "u1", "horizon_s": 3, "window_start": t - 3000, "window_end": t,
...      "impressions": t // 1000, "clicks": 0, "likes": 0, "carts": 0, "orders": 0, "ctr": 0.0,
...      "dwell_sum_ms": 0, "dwell_mean_ms": 0.0, "distinct_counterparts": 1, "dwell_count": 0}
...     for t in (6000, 9000, 3000)]
>>> batch = FeatureColumns.of_records(batch_rows)
>>> keys = batch.keys("p")
>>> keys[0], batch.newest_per_slot(keys).tolist(), batch.values(np.array([1]))[0, :2].tolist()
(b'p:f:user:u1', [1], [9000.0, 9.0])

A window shorter than its horizon is a tile: 60 s in tiles of 3 s is a ring of 20, and the tile
[6000, 9000) sits at position 2 of it.

>>> tiles = FeatureColumns.of_records([{**r, "horizon_s": 60} for r in batch_rows])
>>> [a.tolist() for a in tiles.tiles], len(tiles.newest_per_slot(tiles.keys("p")))
([[20, 20, 20], [1, 2, 0]], 3)

A record whose window is also a tile of longer horizons lists them (`tile_of_horizons_s`), and is
written as a copy per horizon:

>>> both = FeatureColumns.of_records([{**batch_rows[0], "tile_of_horizons_s": [60]}]).with_listed_tiles()
>>> both.horizon_s.tolist(), [a.tolist() for a in both.tiles], both.window_end.tolist()
([3, 60], [[0, 20], [-1, 1]], [6000, 6000])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

from feature_store.keys import SLOT_VALUES, TILE_VALUES, entity_key_prefix
from schemas.bulk import BulkDecoded, take_ragged
from schemas.registry import field_names

# Which FeatureRecord fields name the slot and its window, which carry a user's recent engagements
# (horizon 0 only).
SLOT_FIELDS = ("entity_type", "entity_id", "horizon_s", "window_start", "window_end")
RECENT_FIELDS = ("recent_items", "recent_types", "recent_times_ms")
# a tile's sketch of its distinct counterparts (feature_store.keys)
SKETCH_FIELD = "counterpart_hashes"
# the longer horizons a record's window is also a tile of (one record for them all)
TILE_OF_FIELD = "tile_of_horizons_s"
# every other field is a stored value, in the order the store's layout fixes (a test checks they agree)
SCHEMA_VALUE_FIELDS = tuple(f for f in field_names("FeatureRecord")
                            if f not in (*SLOT_FIELDS, *RECENT_FIELDS, SKETCH_FIELD, TILE_OF_FIELD))
# the JSON names of a user's recent-engagements lists (feature_store.keys)
_RECENT_JSON = {"recent_items": "items", "recent_types": "types", "recent_times_ms": "times_ms"}


@dataclass(frozen=True)
class FeatureColumns:
    """One row per FeatureRecord. `recent`: per list field, its flat items and each row's count
    (a null list counts 0); `hashes`: the tiles' counterpart hashes likewise, and `tile_of` the
    longer horizons each row's window is also a tile of (`with_listed_tiles` makes those rows)."""

    entity_type: np.ndarray  # objects (str)
    entity_id: np.ndarray  # objects (str)
    horizon_s: np.ndarray  # int64
    window_start: np.ndarray  # int64, epoch ms
    window_end: np.ndarray  # int64, epoch ms
    value_columns: dict[str, np.ndarray]  # SLOT_VALUES
    recent_items: dict[str, tuple[np.ndarray, np.ndarray]]
    hashes: tuple[np.ndarray, np.ndarray]  # int64 flat, int64 per row
    tile_of: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros(0, np.int64))  # likewise

    def __len__(self) -> int:
        return len(self.horizon_s)

    @classmethod
    def of_decoded(cls, decoded: BulkDecoded) -> FeatureColumns:
        c = decoded.columns
        return cls(c["entity_type"], c["entity_id"], c["horizon_s"], c["window_start"], c["window_end"],
                   {name: c[name] for name in SLOT_VALUES},
                   {name: (c[name], decoded.lengths[name]) for name in RECENT_FIELDS},
                   (c[SKETCH_FIELD], decoded.lengths[SKETCH_FIELD]),
                   (c[TILE_OF_FIELD], decoded.lengths[TILE_OF_FIELD]))

    @classmethod
    def of_records(cls, records: Sequence[Mapping[str, Any]]) -> FeatureColumns:
        def column(name: str, dtype: Any) -> np.ndarray:
            return np.array([r[name] for r in records], dtype=dtype)

        def flat(name: str, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
            lists = [r.get(name) or [] for r in records]
            return (np.array([v for row in lists for v in row], dtype=dtype),
                    np.array([len(row) for row in lists], dtype=np.int64))

        return cls(column("entity_type", object), column("entity_id", object), column("horizon_s", np.int64),
                   column("window_start", np.int64), column("window_end", np.int64),
                   {name: column(name, np.float64) for name in SLOT_VALUES},
                   {name: flat(name, object) for name in RECENT_FIELDS}, flat(SKETCH_FIELD, np.int64),
                   flat(TILE_OF_FIELD, np.int64))

    def with_listed_tiles(self) -> FeatureColumns:
        """These rows, then per row a copy for each horizon in its `tile_of`, with that horizon (and
        nothing listed): each slot the record fills, as a row of its own."""
        listed, counts = self.tile_of
        if not len(listed):
            return self
        rows = np.concatenate([np.arange(len(self)), np.repeat(np.arange(len(counts)), counts)])
        return self._of_rows(rows, np.concatenate([self.horizon_s, np.asarray(listed, dtype=np.int64)]))

    def where(self, mask: np.ndarray) -> FeatureColumns:
        """The rows where `mask` is True, with the horizons they list."""
        if mask.all():
            return self
        listed, counts = self.tile_of
        rows = np.flatnonzero(mask)
        kept = self._of_rows(rows, self.horizon_s[rows])
        if not len(counts):  # built without the field
            return kept
        return replace(kept, tile_of=(take_ragged(listed, counts, rows), counts[rows]))

    def _of_rows(self, rows: np.ndarray, horizon_s: np.ndarray) -> FeatureColumns:
        """Rows `rows` (repeats allowed) with these horizons, listing none."""
        recent = {name: (take_ragged(flat, n, rows), n[rows]) for name, (flat, n) in self.recent_items.items()}
        hashes, hash_counts = self.hashes
        return FeatureColumns(
            self.entity_type[rows], self.entity_id[rows], horizon_s, self.window_start[rows], self.window_end[rows],
            {name: column[rows] for name, column in self.value_columns.items()}, recent,
            (take_ragged(hashes, hash_counts, rows), hash_counts[rows]))

    def keys(self, prefix: str) -> list[bytes]:
        """Each row's Redis key (feature_store.keys.entity_key), encoded."""
        return [(entity_key_prefix(prefix, t) + i).encode()
                for t, i in zip(self.entity_type.tolist(), self.entity_id.tolist(), strict=True)]

    @cached_property
    def tiles(self) -> tuple[np.ndarray, np.ndarray]:
        """Per row, the ring it belongs to (tiles per horizon, 0 for a whole window: one no shorter
        than its horizon) and its position in that ring (-1 for a whole window); feature_store.keys."""
        length = self.window_end - self.window_start
        is_tile = (length > 0) & (length < self.horizon_s * 1000)
        length = np.where(is_tile, length, 1)
        uneven = is_tile & (self.horizon_s * 1000 % length != 0)
        if uneven.any():
            row = int(np.flatnonzero(uneven)[0])
            raise ValueError(f"a tile of {int(length[row])} ms does not divide its horizon of "
                             f"{int(self.horizon_s[row])} s (flink.horizon_slides_s)")
        ring = np.where(is_tile, self.horizon_s * 1000 // length, 0)
        return ring, np.where(is_tile, self.window_start // length % np.maximum(ring, 1), -1)

    def newest_per_slot(self, keys: Sequence[bytes]) -> np.ndarray:
        """The rows to write: per (key, horizon, ring position), the one with the latest window end (of
        equal ends, the last), as the store would keep them written one after the other."""
        order = np.argsort(self.window_end, kind="stable")
        horizons, positions = self.horizon_s.tolist(), self.tiles[1].tolist()
        # visited oldest first, so each slot keeps the last row it meets
        newest = {(keys[i], horizons[i], positions[i]): i for i in order.tolist()}
        return np.sort(np.fromiter(newest.values(), dtype=np.int64, count=len(newest)))

    def values(self, rows: np.ndarray) -> np.ndarray:
        """[rows, 1 + SLOT_VALUES]: the window end, then the values, as float64."""
        return np.column_stack([self.window_end[rows], *(self.value_columns[n][rows] for n in SLOT_VALUES)]
                               ).astype(np.float64)

    def tile_values(self, rows: np.ndarray) -> np.ndarray:
        """[rows, 1 + TILE_VALUES]: the window end, then what a tile keeps, as float64."""
        return np.column_stack([self.window_end[rows], *(self.value_columns[n][rows] for n in TILE_VALUES)]
                               ).astype(np.float64)

    def sketches(self, rows: np.ndarray) -> list[bytes]:
        """Each row's counterpart hashes as little-endian int64s (empty where the record has none)."""
        flat, counts = self.hashes
        starts = np.cumsum(counts) - counts
        packed = np.ascontiguousarray(flat, dtype="<i8").tobytes()
        return [packed[8 * s:8 * (s + n)] for s, n in zip(starts[rows].tolist(), counts[rows].tolist(), strict=True)]

    def recent(self, row: int) -> dict[str, list[Any]]:
        """Row `row`'s recent-engagements lists, by their JSON names."""
        listed = {}
        for name, (flat, counts) in self.recent_items.items():
            start = self._recent_starts[name][row]
            listed[_RECENT_JSON[name]] = flat[start:start + counts[row]].tolist()
        return listed

    @cached_property
    def _recent_starts(self) -> dict[str, np.ndarray]:
        return {name: np.cumsum(counts) - counts for name, (_, counts) in self.recent_items.items()}
