"""Which decoded FeatureRecords a slot can hold; the others become rejects with their reason.

A record decodes and still cannot be written: a window whose length does not divide the horizon it
is a tile of has no ring position, a listed horizon of 0 would overwrite a user's recent list, and a
window in the far future would win every slot it fills until its TTL (newest window wins). One such
record must go to the dead letters, not end the loader or freeze a slot.

>>> from feature_store.columns import FeatureColumns
>>> row = {"entity_type": "user", "entity_id": "u1", "horizon_s": 3, "window_start": 0, "window_end": 3000,
...        "impressions": 1, "clicks": 0, "likes": 0, "carts": 0, "orders": 0, "ctr": 0.0, "dwell_sum_ms": 0,
...        "dwell_mean_ms": 0.0, "distinct_counterparts": 1, "dwell_count": 0}
>>> batch = FeatureColumns.of_records([row, {**row, "tile_of_horizons_s": [10]}, {**row, "window_start": 4000}])
>>> mask, rejects = check_records(batch, topic="t", latest_start_ms=10_000)
>>> mask.tolist(), [r.reason for r in rejects], rejects[0].key
([True, False, False], ['feature record user u1, window [0, 3000): a window of 3000 ms is no tile of \
the listed horizon 10 s (it must divide it)', 'feature record user u1, window [4000, 3000): the window \
ends before it starts'], b'feature:user:u1:3s:3000')
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from feature_store.columns import FeatureColumns
from schemas.dead_letter import Reject

# The most tiles a horizon's ring may have (a day of one-second tiles): a ring's fields are all written by
# its first tile and all read by every read of its horizon.
MAX_RING_TILES = 86_400
KEPT_ID_CHARS = 600  # of an entity id in a reject's reason and key (a pair's id joins two ids)


def check_records(batch: FeatureColumns, topic: str, latest_start_ms: int | None = None
                  ) -> tuple[np.ndarray, list[Reject]]:
    """A mask of the rows a slot can hold, and a reject for each other one, keyed by its slot and window
    end. `latest_start_ms`: a window starting later is refused (now plus the job's max_future_skew_ms)."""
    length = batch.window_end - batch.window_start
    found: dict[int, str] = {}

    def refuse(bad: np.ndarray, describe: Callable[[int], str], rows: np.ndarray | None = None) -> None:
        """Each row where `bad` (or, with `rows`, the row of each listed horizon where `bad`) gets the
        reason `describe(index into bad)`, unless it has one already."""
        for k in np.flatnonzero(bad).tolist():
            found.setdefault(k if rows is None else int(rows[k]), describe(k))

    refuse(batch.horizon_s < 0, lambda i: f"horizon {batch.horizon_s[i]} s is negative")
    refuse(length < 0, lambda i: "the window ends before it starts")
    if latest_start_ms is not None:
        refuse(batch.window_start > latest_start_ms,
               lambda i: f"the window starts {(batch.window_start[i] - latest_start_ms) / 1000:.0f} s beyond "
                         "the future the job accepts (flink.max_future_skew_ms)")
    for bad, describe in _uneven_tiles(batch.horizon_s, length, "its horizon"):
        refuse(bad & (batch.horizon_s > 0) & (length > 0) & (length < batch.horizon_s * 1000), describe)
    listed, counts = batch.tile_of
    if len(listed):
        rows = np.repeat(np.arange(len(batch)), counts)
        listed = np.asarray(listed, dtype=np.int64)
        refuse(listed <= 0, lambda k: f"it lists {listed[k]} s as a horizon it is a tile of", rows)
        listed_length = length[rows]
        refuse((listed > 0) & (listed_length >= listed * 1000),
               lambda k: f"a window of {listed_length[k]} ms is no tile of the listed horizon {listed[k]} s", rows)
        for bad, describe in _uneven_tiles(listed, listed_length, "the listed horizon"):
            refuse(bad & (listed > 0) & (listed_length > 0), describe, rows)
    mask = np.ones(len(batch), dtype=bool)
    rejects = []
    for i, reason in sorted(found.items()):
        mask[i] = False
        entity, entity_id = str(batch.entity_type[i]), str(batch.entity_id[i])[:KEPT_ID_CHARS]
        rejects.append(Reject(
            f"feature record {entity} {entity_id}, window [{batch.window_start[i]}, {batch.window_end[i]}): {reason}",
            topic, key=f"feature:{entity}:{entity_id}:{batch.horizon_s[i]}s:{batch.window_end[i]}".encode()))
    return mask, rejects


def _uneven_tiles(horizons_s: np.ndarray, length: np.ndarray, which: str
                  ) -> list[tuple[np.ndarray, Callable[[int], str]]]:
    """Where a window of `length` ms, taken as a tile of `horizons_s`, has no ring position (its length
    does not divide the horizon) or would make a ring of more than MAX_RING_TILES; the caller limits
    this to the windows that are tiles. Each with how to describe it."""
    horizon_ms = horizons_s * 1000
    safe = np.maximum(length, 1)
    return [(horizon_ms % safe != 0,
             lambda k: f"a window of {length[k]} ms is no tile of {which} {horizons_s[k]} s (it must divide it)"),
            (horizon_ms // safe > MAX_RING_TILES,
             lambda k: f"{which} {horizons_s[k]} s in tiles of {length[k]} ms would be a ring of more than "
                       f"{MAX_RING_TILES} tiles")]
