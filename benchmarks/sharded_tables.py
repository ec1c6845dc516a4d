"""Row-wise sharded embedding tables, measured by `bench_trainer --only sharding` against what the
trainer does (`trainer.rank_exchange = "gradients"`: every rank holds every table, the row-sparse
gradients are gathered). Here each of N ranks holds 1/N of MF's tables and the ranks exchange the rows
their batches read instead.

MF's tables as one row space: a user's embedding with its bias as one more column, then the items'
likewise (`user_buckets` + `item_buckets` rows of `dim` + 1). Adam is elementwise, so the joined columns
train as the four tables do. Rank r owns the rows g with g % N == r, at local row g // N.

One step on each rank's own batch:
1. the distinct rows the batch reads go to their owners (an all_to_all of their counts, one of the ids);
2. the owners send the rows back (all_to_all);
3. the rank computes MF's logits (the dense layer's too), the loss summed and divided by all ranks'
   sample count, and its gradient with respect to those rows;
4. the row gradients go back to the owners (all_to_all), which sum them per row and take an Adam step
   (RowSparseAdam) on their shard; the dense layer's gradient is all-reduced, as with replication.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from core.settings import TrainerSettings
from gpu_trainer.batch import Batch
from gpu_trainer.distributed import GradientExchange
from gpu_trainer.models import sparse_tables
from gpu_trainer.models.common import signed_log1p
from gpu_trainer.models.mf import IncrementalMF
from gpu_trainer.updates.row_adam import RowSparseAdam
from schemas.feature_set import FEATURE_NAMES


def owned_rows(rows: int, rank: int, world: int) -> torch.Tensor:
    """The global rows rank `rank` holds, in local order.

    >>> owned_rows(7, 1, 3).tolist()
    [1, 4]
    """
    return torch.arange(rank, rows, world)


def initial_table(rows: int, dim: int, seed: int = 0) -> torch.Tensor:
    """The whole table before training, drawn alike on every rank (each keeps its own rows), so any
    number of ranks starts from the same model: embeddings N(0, 0.01²), biases 0."""
    full = torch.zeros(rows, dim + 1)
    full[:, :dim].normal_(std=0.01, generator=torch.Generator().manual_seed(seed))
    return full


def joined_table(model: IncrementalMF) -> torch.Tensor:
    """MF's four tables as the one row space sharded here: each user's embedding and bias, then each
    item's."""
    return torch.cat([torch.cat([model.user.weight, model.user_bias.weight], 1),
                      torch.cat([model.item.weight, model.item_bias.weight], 1)]).detach()


@torch.no_grad()
def load_joined_table(model: IncrementalMF, table: torch.Tensor) -> None:
    """`table`'s rows into MF's four tables (`joined_table` the other way)."""
    users, dim = model.user.num_embeddings, model.user.embedding_dim
    for part, rows in ((model.user, table[:users, :dim]), (model.user_bias, table[:users, dim:]),
                       (model.item, table[users:, :dim]), (model.item_bias, table[users:, dim:])):
        part.weight.copy_(rows)


class ShardedMF:
    def __init__(self, user_buckets: int, item_buckets: int, n_dense: int, dim: int, lr: float, dense_lr: float,
                 seed: int = 0) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.user_buckets, self.dim = user_buckets, dim
        rows = user_buckets + item_buckets
        self.shard = nn.Parameter(initial_table(rows, dim, seed)[owned_rows(rows, self.rank, self.world)].clone())
        self.dense = nn.Linear(n_dense, 1)
        nn.init.zeros_(self.dense.weight)
        nn.init.zeros_(self.dense.bias)
        self.row_optimizer = RowSparseAdam([self.shard], lr=lr)
        self.dense_optimizer = torch.optim.Adam(self.dense.parameters(), lr=dense_lr)
        self.loss_fn = nn.BCEWithLogitsLoss(reduction="sum")
        self.sent_bytes = 0  # what this rank sent to the others: ids, rows and gradients

    def _exchange(self, out: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        got = torch.empty((sum(recv), *out.shape[1:]), dtype=out.dtype)
        dist.all_to_all_single(got, out.contiguous(), recv, send)
        row_bytes = out[:1].numel() * out.element_size()
        self.sent_bytes += (sum(send) - send[self.rank]) * row_bytes
        return got

    def step(self, user_idx: torch.Tensor, item_idx: torch.Tensor, dense: torch.Tensor, label: torch.Tensor,
             total: int) -> float:
        """One step on this rank's batch, `total` the samples of all ranks' batches together. Returns the
        batch's summed loss."""
        ids = torch.cat([user_idx, item_idx + self.user_buckets])
        wanted, inverse = torch.unique(ids, return_inverse=True)
        order = torch.argsort(wanted % self.world, stable=True)  # grouped by owner, as all_to_all sends
        position = torch.empty_like(order)
        position[order] = torch.arange(len(order))
        wanted, inverse = wanted[order], position[inverse]
        send_counts = torch.bincount(wanted % self.world, minlength=self.world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        send, recv = send_counts.tolist(), recv_counts.tolist()
        asked = self._exchange(wanted, send, recv) // self.world  # local rows others read from this shard
        rows = self._exchange(self.shard.detach().index_select(0, asked), recv, send).requires_grad_()

        n = len(user_idx)
        user, item = rows[inverse[:n]], rows[inverse[n:]]
        logits = ((user[:, :self.dim] * item[:, :self.dim]).sum(-1) + user[:, self.dim] + item[:, self.dim]
                  + self.dense(signed_log1p(dense)).squeeze(-1))
        loss_sum = self.loss_fn(logits, label)
        for p in self.dense.parameters():
            p.grad = None
        (loss_sum / total).backward()
        grads = self._exchange(rows.grad if rows.grad is not None else torch.zeros_like(rows), send, recv)
        self.shard.grad = torch.sparse_coo_tensor(asked.unsqueeze(0), grads, self.shard.shape,
                                                  check_invariants=False).coalesce()
        dense_params = list(self.dense.parameters())
        flat = torch.cat([p.grad.reshape(-1) for p in dense_params])  # type: ignore[union-attr]
        dist.all_reduce(flat)
        offset = 0
        for p in dense_params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))  # type: ignore[union-attr]
            offset += p.numel()
        self.row_optimizer.step()
        self.dense_optimizer.step()
        return float(loss_sum.detach())

    def full_table(self) -> np.ndarray:
        """The whole table, gathered from every rank's shard (on every rank)."""
        shards: list[torch.Tensor | None] = [None] * self.world
        dist.all_gather_object(shards, self.shard.detach())
        total = sum(s.shape[0] for s in shards if s is not None)
        full = torch.empty(total, self.dim + 1)
        for r, s in enumerate(shards):
            assert s is not None
            full[owned_rows(total, r, self.world)] = s
        return full.numpy()


def traffic(rng: np.random.Generator, rows: int, cfg: TrainerSettings) -> Batch:
    """A micro-batch of `rows` samples: users uniform over 200,000 ids, items Zipf-distributed (a = 1.2)
    over the item buckets, as popular items recur; each id in its bucket."""
    users = torch.from_numpy(rng.integers(0, 200_000, rows) % cfg.user_buckets)
    items = torch.from_numpy((rng.zipf(1.2, rows) - 1) % cfg.item_buckets)
    dense = torch.from_numpy(rng.exponential(3.0, (rows, len(FEATURE_NAMES))).astype(np.float32))
    label = torch.from_numpy((rng.random(rows) < 0.1).astype(np.float32))
    return Batch(users, items, dense, label, torch.zeros(rows, dtype=torch.int64), np.zeros(rows, dtype=np.uint64))


def gathered_bytes(batch: Batch, cfg: TrainerSettings, world: int) -> int:
    """What a rank exchanging gradients sends per step: its four tables' coalesced row gradients (int64
    index, float32 row) to each other rank."""
    users, items = len(torch.unique(batch.user_idx)), len(torch.unique(batch.item_idx))
    return (users + items) * ((8 + 4 * cfg.embedding_dim) + (8 + 4)) * (world - 1)


class ReplicatedMF:
    """The trainer's way with the same tables (`trainer.rank_exchange = "gradients"`): IncrementalMF
    whole on every rank, its row-sparse gradients gathered by `GradientExchange`, every rank stepping
    on every touched row. Only the tables' part of `Learner.step`: no scores, metrics or digests."""

    def __init__(self, user_buckets: int, item_buckets: int, n_dense: int, dim: int, lr: float,
                 dense_lr: float, seed: int = 0) -> None:
        self.model = IncrementalMF(user_buckets, item_buckets, n_dense, dim)
        load_joined_table(self.model, initial_table(user_buckets + item_buckets, dim, seed))
        self.tables = sparse_tables(self.model)
        self.params = dict(self.model.named_parameters())
        self.optimizers = [RowSparseAdam([self.params[n] for n in self.tables], lr=lr),
                           torch.optim.Adam(self.model.dense.parameters(), lr=dense_lr)]
        self.exchange = GradientExchange()

    def step(self, user_idx: torch.Tensor, item_idx: torch.Tensor, dense: torch.Tensor, label: torch.Tensor,
             total: int) -> float:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        loss_sum = nn.functional.binary_cross_entropy_with_logits(self.model(user_idx, item_idx, dense), label,
                                                                  reduction="sum")
        (loss_sum / total).backward()
        self.exchange.reduce_grads(self.params, self.tables)
        for opt in self.optimizers:
            opt.step()
        return float(loss_sum.detach())

    def table_bytes(self) -> int:
        return sum(self.params[n].numel() for n in self.tables) * 4


def measure_rank(rank: int, world: int, store: str, rows: int, steps: int, out: str) -> None:
    """Spawned per rank: steps per second of the trainer's replicated tables (`ReplicatedMF`) and of the
    sharded ones on the same micro-batches, in alternating blocks; rank 0 writes the figures to `out`
    as JSON."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    cfg = TrainerSettings(model="mf")
    rng = np.random.default_rng(rank)
    batches = [traffic(rng, rows, cfg) for _ in range(8)]
    shape = (cfg.user_buckets, cfg.item_buckets, len(FEATURE_NAMES), cfg.embedding_dim, cfg.lr, cfg.dense_lr)
    ways = {"replicated": ReplicatedMF(*shape), "sharded": ShardedMF(*shape)}
    sharded = ways["sharded"]
    assert isinstance(sharded, ShardedMF)
    took = {"replicated": 0.0, "sharded": 0.0}
    done = {"replicated": 0, "sharded": 0}
    block = 5
    for k in range(-1, steps // block):  # block -1 warms both up, uncounted
        for how in ("replicated", "sharded"):
            if how == "sharded":
                sharded.sent_bytes = 0
            dist.barrier()
            began = time.perf_counter()
            for j in range(block):
                b = batches[(k * block + j) % len(batches)]
                ways[how].step(b.user_idx, b.item_idx, b.dense, b.label, total=rows * world)
            dist.barrier()
            if k >= 0:
                took[how] += time.perf_counter() - began
                done[how] += block
    if rank == 0:
        replicated = ways["replicated"]
        assert isinstance(replicated, ReplicatedMF)
        results = dict(
            world=world, rows=rows,
            replicated_samples_per_s=done["replicated"] * rows * world / took["replicated"],
            sharded_samples_per_s=done["sharded"] * rows * world / took["sharded"],
            replicated_sent_bytes_per_step=gathered_bytes(batches[0], cfg, world),
            sharded_sent_bytes_per_step=sharded.sent_bytes / block,
            # weights and Adam's two moments per row
            replicated_table_bytes_per_rank=3 * replicated.table_bytes(),
            sharded_table_bytes_per_rank=3 * sharded.shard.numel() * 4)
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()
