from __future__ import annotations

import torch
from torch import nn


def signed_log1p(x: torch.Tensor) -> torch.Tensor:
    """Compresses counts and durations of any scale into a trainable range, keeping sign and zero."""
    return torch.sign(x) * torch.log1p(torch.abs(x))


def mean_pool(table: nn.Embedding, idx: torch.Tensor) -> torch.Tensor:
    """The mean of `table`'s rows at `idx` [B, H] per row, -1 entries left out (all -1: zeros)."""
    present = (idx >= 0).unsqueeze(-1).to(table.weight.dtype)
    summed = (table(idx.clamp(min=0)) * present).sum(1)
    return summed / present.sum(1).clamp(min=1.0)
