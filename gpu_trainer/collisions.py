"""How often distinct ids share an embedding row (hashed tables have a fixed size).

collision rate = 1 - occupied rows / distinct ids seen. Exact until `cap` distinct ids per table;
after that it is estimated on the ids tracked so far (memory stays bounded).

>>> import numpy as np
>>> c = CollisionCounter(n_buckets=4)
>>> c.update(np.array([1, 2, 5], dtype=np.uint64))  # 1 and 5 share row 1
>>> round(c.rate(), 3)
0.333
"""

from __future__ import annotations

import numpy as np


class CollisionCounter:
    def __init__(self, n_buckets: int, cap: int = 2_000_000) -> None:
        self.n_buckets = n_buckets
        self.cap = cap
        self._ids: set[int] = set()
        self._rows: set[int] = set()

    def update(self, hashes: np.ndarray) -> None:
        if len(self._ids) >= self.cap:
            return
        unique = np.unique(hashes)
        self._ids.update(unique.tolist())
        self._rows.update((unique % np.uint64(self.n_buckets)).tolist())

    @property
    def distinct_ids(self) -> int:
        return len(self._ids)

    def rate(self) -> float:
        return 0.0 if not self._ids else 1.0 - len(self._rows) / len(self._ids)
