from __future__ import annotations

import torch


def signed_log1p(x: torch.Tensor) -> torch.Tensor:
    """Compresses counts and durations of any scale into a trainable range, keeping sign and zero."""
    return torch.sign(x) * torch.log1p(torch.abs(x))
