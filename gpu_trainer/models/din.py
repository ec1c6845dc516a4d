"""Matrix factorisation whose user side adds the user's recent items weighted by their relevance to
the candidate: the activation unit of DIN (Zhou et al., 2018, "Deep Interest Network").

Each recent item's key is its item embedding plus embeddings of its event type (an order says more
than a click) and its age bucket (a minute ago says more than an hour ago). A small MLP scores each
key against the candidate from (key, candidate, key - candidate, key * candidate). The scores are
softmax-normalised over the present items and one empty slot of score 0, so a history with nothing
relevant to the candidate can add next to nothing (DIN drops the softmax for the same reason). The
MLP's last layer starts at 0: a new model weighs the recent items equally, as mean pooling does,
and learns which ones matter."""

from __future__ import annotations

import torch
from torch import nn

from gpu_trainer.models.common import signed_log1p


class DIN(nn.Module):
    def __init__(self, user_buckets: int, item_buckets: int, n_dense: int, embedding_dim: int = 32,
                 init_std: float = 0.01, history_length: int = 10, type_buckets: int = 16, age_buckets: int = 16,
                 attention_hidden: int = 32) -> None:
        super().__init__()
        if history_length < 1:
            raise ValueError("the din model attends over recent items: set trainer.history_length > 0")
        self.history_length = history_length
        self.user = nn.Embedding(user_buckets, embedding_dim, sparse=True)
        self.item = nn.Embedding(item_buckets, embedding_dim, sparse=True)
        self.user_bias = nn.Embedding(user_buckets, 1, sparse=True)
        self.item_bias = nn.Embedding(item_buckets, 1, sparse=True)
        self.history_type = nn.Embedding(type_buckets, embedding_dim, sparse=True)
        self.history_age = nn.Embedding(age_buckets, embedding_dim, sparse=True)
        # how much an engagement of a type and age counts whatever the candidate: learnt from the first
        # batches on, while the item embeddings the activation unit compares are still noise
        self.history_type_weight = nn.Embedding(type_buckets, 1, sparse=True)
        self.history_age_weight = nn.Embedding(age_buckets, 1, sparse=True)
        self.attention = nn.Sequential(nn.Linear(4 * embedding_dim, attention_hidden), nn.ReLU(),
                                       nn.Linear(attention_hidden, 1))
        self.dense = nn.Linear(n_dense, 1)
        for table in (self.user, self.item):
            nn.init.normal_(table.weight, std=init_std)
        for table in (self.user_bias, self.item_bias, self.history_type, self.history_age,
                      self.history_type_weight, self.history_age_weight):
            nn.init.zeros_(table.weight)
        last = self.attention[-1]
        assert isinstance(last, nn.Linear)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        nn.init.zeros_(self.dense.weight)
        nn.init.zeros_(self.dense.bias)

    def init_output_bias(self, logit: float) -> None:
        with torch.no_grad():
            self.dense.bias.fill_(logit)

    def interest(self, candidate: torch.Tensor, history_idx: torch.Tensor, history_type: torch.Tensor | None,
                 history_age: torch.Tensor | None) -> torch.Tensor:
        """The recent items' keys [B, H, D] pooled by their relevance to `candidate` [B, D]."""
        # types and ages not given are bucket 0, "not known", with learnt vectors of their own
        types = torch.zeros_like(history_idx) if history_type is None else history_type
        ages = torch.zeros_like(history_idx) if history_age is None else history_age
        keys = self.item(history_idx.clamp(min=0)) + self.history_type(types) + self.history_age(ages)
        query = candidate.unsqueeze(1).expand_as(keys)
        scores = self.attention(torch.cat([keys, query, keys - query, keys * query], dim=-1)).squeeze(-1)
        scores = scores + self.history_type_weight(types).squeeze(-1) + self.history_age_weight(ages).squeeze(-1)
        scores = scores.masked_fill(history_idx < 0, float("-inf"))
        empty = torch.zeros_like(scores[:, :1])
        weights = torch.softmax(torch.cat([scores, empty], dim=1), dim=1)[:, :-1]
        return (weights.unsqueeze(-1) * keys).sum(1)

    def forward(self, user_idx: torch.Tensor, item_idx: torch.Tensor, dense: torch.Tensor,
                history_idx: torch.Tensor | None = None, history_type: torch.Tensor | None = None,
                history_age: torch.Tensor | None = None) -> torch.Tensor:
        user, candidate = self.user(user_idx), self.item(item_idx)
        if history_idx is not None:
            user = user + self.interest(candidate, history_idx, history_type, history_age)
        interaction = (user * candidate).sum(-1)
        biases = self.user_bias(user_idx).squeeze(-1) + self.item_bias(item_idx).squeeze(-1)
        return interaction + biases + self.dense(signed_log1p(dense)).squeeze(-1)
