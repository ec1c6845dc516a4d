"""Online elastic weight consolidation (Schwarz et al., 2018), diagonal Fisher, sparse-aware.

penalty = lambda/2 * sum_i F_i * (theta_i - theta*_i)^2, with gradient lambda * F * (theta - theta*).

- `observe(grads)` keeps a running estimate of the diagonal Fisher from recent batches' squared
  data-loss gradients (an EMA with `fisher_momentum`); for an embedding table only the batch's rows.
- `consolidate(params)` (at each promoted snapshot): F* <- decay * F* + F_running, theta* <- theta.
- `add_penalty_grad(params)` adds the penalty's gradient to `.grad`; for an embedding table only on
  the rows present in its sparse gradient, so the cost follows the batch.

>>> import torch
>>> ewc = OnlineEWC({"w": torch.zeros(2)}, lam=2.0, fisher_momentum=0.0, decay=1.0, sparse_names=set())
>>> ewc.observe({"w": torch.tensor([1.0, 2.0])})
>>> ewc.consolidate({"w": torch.zeros(2)})
>>> round(ewc.penalty({"w": torch.tensor([1.0, 1.0])}).item(), 6)  # 2/2 * (1*1 + 4*1)
5.0
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


class OnlineEWC:
    def __init__(self, params: Mapping[str, torch.Tensor], lam: float, fisher_momentum: float, decay: float,
                 sparse_names: set[str]) -> None:
        self.lam = lam
        self.fisher_momentum = fisher_momentum
        self.decay = decay
        self.sparse_names = set(sparse_names)
        self.running = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()}
        self.fisher = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()}
        self.anchor = {n: p.detach().clone().float() for n, p in params.items()}

    @torch.no_grad()
    def observe(self, grads: Mapping[str, torch.Tensor | None], batch_size: int = 1) -> None:
        """`grads` are of the batch-mean loss; squared and scaled by the batch size they estimate the
        per-sample Fisher (the mean of B independent gradients has 1/B of their second moment)."""
        m = self.fisher_momentum
        for name, g in grads.items():
            if g is None:
                continue
            running = self.running[name]
            if g.is_sparse:
                g = g.coalesce()
                rows, values = g.indices()[0], g.values().float()
                running.index_copy_(0, rows, running.index_select(0, rows) * m + (1 - m) * batch_size * values.pow(2))
            else:
                running.mul_(m).add_(g.float().pow(2), alpha=(1 - m) * batch_size)

    @torch.no_grad()
    def consolidate(self, params: Mapping[str, torch.Tensor]) -> None:
        for name, p in params.items():
            self.fisher[name].mul_(self.decay).add_(self.running[name])
            self.anchor[name].copy_(p.detach())

    def penalty(self, params: Mapping[str, torch.Tensor],
                rows: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
        """The penalty's value (differentiable for dense tensors); restricted to `rows` where given."""
        total = torch.zeros((), dtype=torch.float32)
        for name, p in params.items():
            f, a = self.fisher[name], self.anchor[name]
            if rows is not None and name in rows:
                r = rows[name]
                p, f, a = p.index_select(0, r), f.index_select(0, r), a.index_select(0, r)
            total = total + (f * (p.float() - a).pow(2)).sum()
        return 0.5 * self.lam * total

    @torch.no_grad()
    def add_penalty_grad(self, params: Mapping[str, torch.nn.Parameter]) -> None:
        for name, p in params.items():
            if p.grad is None:
                continue
            f, a = self.fisher[name], self.anchor[name]
            if p.grad.is_sparse:
                grad = p.grad.coalesce()
                r = grad.indices()[0]
                extra = self.lam * f.index_select(0, r) * (p.detach().index_select(0, r).float() - a.index_select(0, r))
                p.grad = torch.sparse_coo_tensor(grad.indices(), grad.values() + extra.to(grad.dtype), grad.shape,
                                                 check_invariants=False, is_coalesced=True)
            else:
                p.grad.add_((self.lam * f * (p.detach().float() - a)).to(p.grad.dtype))

    def state(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"fisher": self.fisher, "anchor": self.anchor}

    def load(self, fisher: Mapping[str, torch.Tensor], anchor: Mapping[str, torch.Tensor]) -> None:
        for name in self.fisher:
            self.fisher[name].copy_(fisher[name])
            self.anchor[name].copy_(anchor[name])
