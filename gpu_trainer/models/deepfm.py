"""DeepFM: first-order terms, FM pairwise interactions over the user, item and dense-feature fields,
and an MLP over their concatenation (Guo et al., 2017)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from gpu_trainer.models.common import signed_log1p


class DeepFM(nn.Module):
    def __init__(self, user_buckets: int, item_buckets: int, n_dense: int, embedding_dim: int = 16,
                 hidden_dims: Sequence[int] = (128, 64), init_std: float = 0.01) -> None:
        super().__init__()
        self.user = nn.Embedding(user_buckets, embedding_dim, sparse=True)
        self.item = nn.Embedding(item_buckets, embedding_dim, sparse=True)
        self.user_bias = nn.Embedding(user_buckets, 1, sparse=True)
        self.item_bias = nn.Embedding(item_buckets, 1, sparse=True)
        self.dense_linear = nn.Linear(n_dense, 1)
        self.dense_vectors = nn.Parameter(torch.randn(n_dense, embedding_dim) * init_std)
        layers: list[nn.Module] = []
        width = embedding_dim * 2 + n_dense
        for hidden in hidden_dims:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)
        for table in (self.user, self.item):
            nn.init.normal_(table.weight, std=init_std)
        for table in (self.user_bias, self.item_bias):
            nn.init.zeros_(table.weight)
        nn.init.zeros_(self.dense_linear.weight)
        nn.init.zeros_(self.dense_linear.bias)
        last = self.mlp[-1]
        assert isinstance(last, nn.Linear)
        nn.init.zeros_(last.weight)  # the deep part starts at 0 and grows from the data

    def init_output_bias(self, logit: float) -> None:
        with torch.no_grad():
            self.dense_linear.bias.fill_(logit)

    def forward(self, user_idx: torch.Tensor, item_idx: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        x = signed_log1p(dense)
        u, i = self.user(user_idx), self.item(item_idx)
        fields = torch.cat([u.unsqueeze(1), i.unsqueeze(1), x.unsqueeze(-1) * self.dense_vectors], dim=1)
        fm = 0.5 * (fields.sum(1).pow(2) - fields.pow(2).sum(1)).sum(-1)
        first = self.user_bias(user_idx).squeeze(-1) + self.item_bias(item_idx).squeeze(-1)
        first = first + self.dense_linear(x).squeeze(-1)
        deep = self.mlp(torch.cat([u, i, x], dim=-1)).squeeze(-1)
        return first + fm + deep
