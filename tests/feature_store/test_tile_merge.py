from __future__ import annotations

import numpy as np
import pytest

from feature_store.keys import TILE_VALUES
from feature_store.tile_merge import ENTITY_BITS, MERGED_VALUES, distinct_counts, merge_rings


def test_entities_beyond_the_sort_keys_bits_are_refused_not_miscounted() -> None:
    n = 1 << ENTITY_BITS
    tiles = np.zeros((n, 2, 1 + len(TILE_VALUES)))
    with pytest.raises(ValueError, match=f"fewer than {n} entities"):
        distinct_counts(tiles, [[None, None]] * n, 6, None)
    assert distinct_counts(tiles[:-1], [[None, None]] * (n - 1), 6, None).shape == (n - 1,)


def test_a_tile_on_the_horizons_edge_is_left_out_and_the_newest_end_counts_in() -> None:
    ring = np.zeros((1, 1, 3, 1 + len(TILE_VALUES)))
    ring[0, 0, :, 0] = [3000, 6000, 9000]
    ring[0, 0, :, 1 + TILE_VALUES.index("impressions")] = [1, 10, 100]
    merged, ends = merge_rings(ring, [6], [9000.0])
    assert merged[0, 0, MERGED_VALUES.index("impressions")] == 110  # (3000, 9000]: 3000 itself is out
    assert ends.tolist() == [[9000]]
