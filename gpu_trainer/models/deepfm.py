"""DeepFM: first-order terms, FM pairwise interactions over the user, item and dense-feature fields,
and an MLP over their concatenation (Guo et al., 2017). With `history_length`, the mean of the
user's recent items' embeddings is one more field."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from gpu_trainer.models.common import mean_pool, signed_log1p


class DeepFM(nn.Module):
    def __init__(self, user_buckets: int, item_buckets: int, n_dense: int, embedding_dim: int = 16,
                 hidden_dims: Sequence[int] = (128, 64), init_std: float = 0.01, history_length: int = 0) -> None:
        super().__init__()
        self.history_length = history_length
        self.user = nn.Embedding(user_buckets, embedding_dim, sparse=True)
        self.item = nn.Embedding(item_buckets, embedding_dim, sparse=True)
        self.user_bias = nn.Embedding(user_buckets, 1, sparse=True)
        self.item_bias = nn.Embedding(item_buckets, 1, sparse=True)
        self.dense_linear = nn.Linear(n_dense, 1)
        self.dense_vectors = nn.Parameter(torch.randn(n_dense, embedding_dim) * init_std)
        layers: list[nn.Module] = []
        width = embedding_dim * (3 if history_length else 2) + n_dense
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

    def forward(self, user_idx: torch.Tensor, item_idx: torch.Tensor, dense: torch.Tensor,
                history_idx: torch.Tensor | None = None, history_type: torch.Tensor | None = None,
                history_age: torch.Tensor | None = None) -> torch.Tensor:
        # the recent items' types and ages are read by the din model only
        x = signed_log1p(dense)
        u, i = self.user(user_idx), self.item(item_idx)
        ids = [u, i]
        if self.history_length:
            # a model built to read histories always has the field; a row without one pools to zeros
            if history_idx is None:
                history_idx = torch.full((len(user_idx), 1), -1, dtype=torch.int64, device=user_idx.device)
            ids.append(mean_pool(self.item, history_idx))
        fields = torch.cat([*(e.unsqueeze(1) for e in ids), x.unsqueeze(-1) * self.dense_vectors], dim=1)
        fm = 0.5 * (fields.sum(1).pow(2) - fields.pow(2).sum(1)).sum(-1)
        first = self.user_bias(user_idx).squeeze(-1) + self.item_bias(item_idx).squeeze(-1)
        first = first + self.dense_linear(x).squeeze(-1)
        deep = self.mlp(torch.cat([*ids, x], dim=-1)).squeeze(-1)
        return first + fm + deep
