"""A tiled horizon's value at read time, from the tiles of an entity's ring (`feature_store.keys`):
the tiles inside the horizon added up, ratios taken from the sums, and distinct counterparts from the
tiles' sketches. Pure numpy over every entity of a read at once; the store fetches the rings."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from feature_store.base import UNKNOWN_WINDOW_END
from feature_store.keys import TILE_VALUES

ENTITY_BITS = 14  # the entities of one call to distinct_counts fit in these
MERGED_VALUES = (*TILE_VALUES, "ctr", "dwell_mean_ms")
DISTINCT = "distinct_counterparts"
_DISTINCT = 1 + TILE_VALUES.index("distinct_counterparts")  # in a tile, after its window end
_RATIOS = {MERGED_VALUES.index("ctr"): (TILE_VALUES.index("clicks"), TILE_VALUES.index("impressions")),
           MERGED_VALUES.index("dwell_mean_ms"): (TILE_VALUES.index("dwell_sum_ms"), TILE_VALUES.index("dwell_count"))}


def merge_rings(tiles: np.ndarray, horizons_s: Sequence[int], as_of_ms: Sequence[float | None],
                ) -> tuple[np.ndarray, np.ndarray]:
    """Each entity's horizons from its rings `tiles` [entity, ring, tile, window end + TILE_VALUES] of
    the horizons `horizons_s`: per ring, the tiles ending in (as_of - horizon, as_of] added up, ratios
    from the sums, distinct counterparts the most of any tile. An `as_of_ms` of None (no progress
    written) takes each entity's newest tile end in that ring. Returns the values [entity, ring,
    MERGED_VALUES], NaN for an entity with no tile in a ring, and the window end (as_of) [entity, ring],
    UNKNOWN_WINDOW_END for those. All rings in one pass: each numpy call costs microseconds at a
    hundred entities.

    >>> ring = np.zeros((2, 1, 3, 9)); ring[0, 0, :, 0] = [3000, 6000, 9000]; ring[0, 0, :, 1] = [1, 2, 4]
    >>> ring[0, 0, :, 2] = [1, 0, 1]; ring[0, 0, :, 8] = [3, 1, 2]
    >>> merged, ends = merge_rings(np.concatenate([ring, ring], axis=1), [6, 9], [9000.0, None])
    >>> merged[..., MERGED_VALUES.index("impressions")].tolist(), ends.tolist()
    ([[6.0, 7.0], [nan, nan]], [[9000, 9000], [-1, -1]])
    >>> round(float(merged[0, 0, MERGED_VALUES.index("ctr")]), 3), merged[:, 0, MERGED_VALUES.index(DISTINCT)].tolist()
    (0.167, [2.0, nan])
    """
    ends = np.ascontiguousarray(tiles[..., 0])  # compared three times: strided, each took longer than the copy
    as_of = np.array([np.nan if a is None else a for a in as_of_ms])
    if np.isnan(as_of).any():
        as_of = np.where(np.isnan(as_of), ends.max(axis=2), as_of)  # [entity, ring]
    as_of = np.broadcast_to(as_of, ends.shape[:2])[..., None]
    since = as_of - np.asarray(horizons_s, dtype=np.float64)[:, None] * 1000
    weights = ((ends > since) & (ends <= as_of)).astype(np.float64)
    merged = np.empty((*tiles.shape[:2], len(MERGED_VALUES)))
    # a weighted sum over the tiles: no masked copy of the rings (it was most of a read's numpy time)
    np.matmul(weights[..., None, :], tiles[..., 1:], out=merged[..., None, :len(TILE_VALUES)])
    merged[..., _DISTINCT - 1] = (tiles[..., _DISTINCT] * weights).max(axis=2)  # counts are >= 0
    for ratio, (numerator, denominator) in _RATIOS.items():
        merged[..., ratio] = 0.0
        np.divide(merged[..., numerator], merged[..., denominator], out=merged[..., ratio],
                  where=merged[..., denominator] > 0)
    known = (ends > 0).any(axis=2)
    merged[~known] = np.nan
    return merged, np.where(known, as_of[..., 0], UNKNOWN_WINDOW_END).astype(np.int64)


def distinct_counts(tiles: np.ndarray, sketches: Sequence[Sequence[bytes | None]], horizon_s: int,
                    as_of_ms: float | None) -> np.ndarray:
    """Each entity's distinct counterparts over the horizon: its ring `tiles` [entity, tile, window end +
    TILE_VALUES] and the sketch at each ring position (feature_store.keys), over the tiles that
    `merge_rings` adds up. While no tile kept only its smallest hashes (it saw more ids than its sketch
    holds), the union of the tiles' hashes is the horizon's, and the count exact. Else, below theta, the
    smallest largest hash of such a tile, the union holds every hash of the horizon, and their number
    divided by theta / 2**63 estimates the count: a theta sketch's estimate, unbiased, with a relative
    error near 1/sqrt(that number), at least the sketch size. A tile without its sketch (written by
    an earlier job, or replaced since the ring was read) adds nothing to the union, and the answer is
    never below the most of any one tile, which was the whole answer before the sketches. NaN for an
    entity with no tile. Every entity at once, in numpy.

    >>> import struct
    >>> ring = np.zeros((2, 3, 9)); ring[0, :, 0] = [3000, 6000, 9000]; ring[0, :, 8] = [2, 2, 1]
    >>> sk = [struct.pack("<d", e) + (np.array(h, "<i8") << 40).tobytes() for e, h in ((3000, [5, 9]), (6000, [1, 9]))]
    >>> distinct_counts(ring, [[*sk, None], [None] * 3], 9, 9000.0).tolist()
    [3.0, nan]
    >>> distinct_counts(ring, [[*sk, None], [None] * 3], 6, 9000.0).tolist()
    [2.0, nan]
    """
    n, ring = tiles.shape[:2]
    if n >= 1 << ENTITY_BITS:  # the sort key holds the entity in its top bits
        raise ValueError(f"distinct_counts takes fewer than {1 << ENTITY_BITS} entities at once, not {n}")
    ends, counts = tiles[:, :, 0], tiles[:, :, _DISTINCT]
    as_of = ends.max(axis=1, keepdims=True) if as_of_ms is None else np.float64(as_of_ms)
    inside = ((ends > as_of - horizon_s * 1000) & (ends <= as_of)).reshape(-1)
    lower = np.where(inside.reshape(n, ring), counts, 0.0).max(axis=1, initial=0.0)
    # one buffer of 8-byte words: per sketch its window end, then its hashes (8 zero bytes after them)
    pieces = [b"" if v is None or len(v) <= 8 or len(v) % 8 else v for row in sketches for v in row]
    size = np.fromiter(map(len, pieces), dtype=np.int64, count=n * ring) // 8
    pieces.append(bytes(8))
    words = np.frombuffer(b"".join(pieces), dtype="<i8")
    start = np.cumsum(size) - size
    valid = (size > 0) & inside & (words.view("<f8")[start] == ends.reshape(-1))
    hashes = np.where(valid, size - 1, 0)
    entity = np.repeat(np.arange(n), ring)
    cut = valid & (hashes < counts.reshape(-1))  # the tile kept its smallest hashes only
    theta = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(theta, entity[cut], words[(start + size - 1)[cut]])
    has_cut = np.bincount(entity[cut], minlength=n) > 0
    # every hash of a valid sketch (a sketch's words are contiguous, an entity's sketches too), keyed
    # by its entity and its top 49 bits: one sort of that key (a sort by two keys took about four times
    # as long); two of an entity's ids share those bits with odds near n**2 / 2**50
    taken = np.repeat(valid, size)
    taken[start[size > 0]] = False  # the window ends
    shift, bits = 63 - ENTITY_BITS, ENTITY_BITS
    entity_bits = np.repeat(np.arange(n, dtype=np.int64) << shift, size.reshape(n, ring).sum(axis=1))
    key = np.right_shift(words[:-1], bits)
    key = np.bitwise_or(key, entity_bits, out=key)[taken]  # in place: one temporary megabyte fewer
    key.sort()
    if len(key):
        first = np.empty(len(key), dtype=bool)
        first[0] = True
        np.not_equal(key[1:], key[:-1], out=first[1:])
        key = key[first]
    # an entity's hashes are a run of the sorted keys: counted by where the runs and theta fall
    entity_from = np.searchsorted(key, np.arange(n + 1, dtype=np.int64) << shift)
    union = np.diff(entity_from).astype(np.float64)
    below = (np.searchsorted(key, np.arange(n, dtype=np.int64) << shift | theta >> bits)
             - entity_from[:-1]).astype(np.float64)
    estimate = np.divide(below, theta / 2.0**63, out=np.zeros(n), where=has_cut & (theta > 0))
    counted = np.where(has_cut, np.maximum(estimate, below + 1), union)
    got = np.maximum(np.where(union > 0, counted, 0.0), lower)
    got[~(ends > 0).any(axis=1)] = np.nan
    return got
