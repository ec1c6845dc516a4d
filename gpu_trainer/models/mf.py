"""Matrix factorisation with biases and a linear term over the dense window features.

With `history_length`, the user's side also holds the mean of the item embeddings of the user's
recent items (as SVD++ adds implicit feedback to the user factor), so a user's tastes of the last
minutes score candidates before the user's own embedding has moved."""

from __future__ import annotations

import torch
from torch import nn

from gpu_trainer.models.common import mean_pool, signed_log1p


class IncrementalMF(nn.Module):
    def __init__(self, user_buckets: int, item_buckets: int, n_dense: int, embedding_dim: int = 32,
                 init_std: float = 0.01, history_length: int = 0) -> None:
        super().__init__()
        self.history_length = history_length
        self.user = nn.Embedding(user_buckets, embedding_dim, sparse=True)
        self.item = nn.Embedding(item_buckets, embedding_dim, sparse=True)
        self.user_bias = nn.Embedding(user_buckets, 1, sparse=True)
        self.item_bias = nn.Embedding(item_buckets, 1, sparse=True)
        self.dense = nn.Linear(n_dense, 1)
        for table in (self.user, self.item):
            nn.init.normal_(table.weight, std=init_std)
        for table in (self.user_bias, self.item_bias):
            nn.init.zeros_(table.weight)
        # A fresh model starts neutral: random dense weights would rank by noise until enough steps pass.
        nn.init.zeros_(self.dense.weight)
        nn.init.zeros_(self.dense.bias)

    def init_output_bias(self, logit: float) -> None:
        with torch.no_grad():
            self.dense.bias.fill_(logit)

    def forward(self, user_idx: torch.Tensor, item_idx: torch.Tensor, dense: torch.Tensor,
                history_idx: torch.Tensor | None = None, history_type: torch.Tensor | None = None,
                history_age: torch.Tensor | None = None) -> torch.Tensor:
        # the recent items' types and ages are read by the din model only
        user = self.user(user_idx)
        if self.history_length and history_idx is not None:
            user = user + mean_pool(self.item, history_idx)
        interaction = (user * self.item(item_idx)).sum(-1)
        biases = self.user_bias(user_idx).squeeze(-1) + self.item_bias(item_idx).squeeze(-1)
        return interaction + biases + self.dense(signed_log1p(dense)).squeeze(-1)
