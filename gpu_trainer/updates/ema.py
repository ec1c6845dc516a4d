"""Exponential moving average of weights, row-sparse for embedding tables.

shadow <- m * shadow + (1 - m) * param, for every dense parameter and, in each embedding table, only
for the rows the batch touched: the cost follows the batch, not the table size. Untouched rows did
not change in that step (the sparse optimiser leaves them alone), so skipping them only delays their
averaging until they are next seen.

>>> import torch
>>> ema = EMA({"w": torch.zeros(3, 1)}, momentum=0.5, sparse_names={"w"})
>>> ema.update({"w": torch.ones(3, 1)}, {"w": torch.tensor([1])})
>>> ema.shadow["w"].flatten().tolist()
[0.0, 0.5, 0.0]
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


class EMA:
    def __init__(self, params: Mapping[str, torch.Tensor], momentum: float, sparse_names: set[str]) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"EMA momentum must be in [0, 1), got {momentum}")
        self.momentum = momentum
        self.sparse_names = set(sparse_names)
        self.shadow = {name: p.detach().clone() for name, p in params.items()}

    @torch.no_grad()
    def update(self, params: Mapping[str, torch.Tensor], touched_rows: Mapping[str, torch.Tensor]) -> None:
        """`touched_rows[name]`: unique row ids the batch used, for each sparse (embedding) parameter."""
        weight = 1.0 - self.momentum
        for name, p in params.items():
            shadow = self.shadow[name]
            if name in self.sparse_names:
                rows = touched_rows[name]
                shadow.index_copy_(0, rows, torch.lerp(shadow.index_select(0, rows), p.index_select(0, rows), weight))
            else:
                shadow.lerp_(p.detach(), weight)

    def state(self) -> dict[str, torch.Tensor]:
        return self.shadow

    def load(self, shadow: Mapping[str, torch.Tensor]) -> None:
        for name, value in shadow.items():
            self.shadow[name].copy_(value)
