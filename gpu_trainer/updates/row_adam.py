"""Adam for embedding tables, on the rows a sparse gradient touches: torch's SparseAdam's update, made
of row gathers and scatters (`index_select`, `index_copy_`, `index_add_`) instead of its sparse-tensor
arithmetic (`sparse_mask` and sparse additions), which took about twice as long per step on CPU.

For each touched row r, with g the row's gradient summed over the batch (duplicates coalesced):
m[r] <- b1 m[r] + (1 - b1) g, v[r] <- b2 v[r] + (1 - b2) g², w[r] <- w[r] - lr_t m[r] / (sqrt(v[r]) + eps),
lr_t = lr sqrt(1 - b2^t) / (1 - b1^t); untouched rows keep their moments and weights, as in SparseAdam.

>>> w = torch.nn.Parameter(torch.zeros(4, 2))
>>> opt = RowSparseAdam([w], lr=0.1)
>>> w.grad = torch.sparse_coo_tensor([[1, 1, 3]], torch.ones(3, 2), (4, 2), check_invariants=True)
>>> opt.step()
>>> [round(x, 4) for x in w.detach()[:, 0].tolist()]
[0.0, -0.1, 0.0, -0.1]
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch


class RowSparseAdam(torch.optim.SparseAdam):
    """SparseAdam's state (`step`, `exp_avg`, `exp_avg_sq`) and arguments, its update by rows."""

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                if not param.grad.is_sparse:
                    raise RuntimeError("RowSparseAdam takes sparse gradients (embeddings with sparse=True)")
                state = self.state[param]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = untouched_zeros(param)
                    state["exp_avg_sq"] = untouched_zeros(param)
                state["step"] += 1
                grad = param.grad.coalesce()  # the update is not linear in g: each row once, summed
                rows, values = grad.indices()[0], grad.values()
                if group.get("maximize", False):
                    values = -values
                if not len(rows):
                    continue
                _update_rows(param, state["exp_avg"], state["exp_avg_sq"], rows, values, state["step"],
                             group["lr"], beta1, beta2, group["eps"])
        return loss


def untouched_zeros(like: torch.Tensor) -> torch.Tensor:
    """Zeros shaped like `like`, on its device. On CPU they come from calloc, whose large blocks are
    fresh pages the OS fills with zeros only when first written: a table's moments then cost time and
    memory for the rows that train, not for every bucket. `torch.zeros_like` writes all of them, 0.1 to
    0.5 s for the default tables' 128 MB of moments on the service's first step on 2 cores.

    >>> untouched_zeros(torch.ones(2, 3, dtype=torch.float64))
    tensor([[0., 0., 0.],
            [0., 0., 0.]], dtype=torch.float64)
    """
    if like.device.type != "cpu" or not like.is_contiguous() or like.dtype not in _NUMPY_DTYPES:
        return torch.zeros_like(like, memory_format=torch.preserve_format)
    return torch.from_numpy(np.zeros(tuple(like.shape), dtype=_NUMPY_DTYPES[like.dtype]))


_NUMPY_DTYPES = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}


def _update_rows(param: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, rows: torch.Tensor,
                 grad: torch.Tensor, step: int, lr: float, beta1: float, beta2: float, eps: float) -> None:
    avg = exp_avg.index_select(0, rows).mul_(beta1).add_(grad, alpha=1 - beta1)
    avg_sq = exp_avg_sq.index_select(0, rows).mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    exp_avg.index_copy_(0, rows, avg)
    exp_avg_sq.index_copy_(0, rows, avg_sq)
    step_size = lr * math.sqrt(1 - beta2**step) / (1 - beta1**step)
    param.index_add_(0, rows, avg.div_(avg_sq.sqrt_().add_(eps)).mul_(-step_size))
