"""The trainer as N torch.distributed ranks, launched by torchrun (elastic rendezvous; gloo carries the
exchange, which is of host memory whatever the device).

Each rank consumes its own share of the samples topic's partitions (partition p belongs to rank
p mod N) and decodes its own records: that is where one process spends its time (Avro decoding in
Python, ~15-35k samples/s here, against a training step of ~280k). Once a round, the ranks exchange
what they polled, as the model reads it (bucket ids, features, label, time and id hashes: about 110
bytes a sample, hashed by the rank that polled it), with the offsets it ends at and a few flags, and
every rank takes the same step on the union, in rank order: the replicas of the
model, its embedding tables included, stay identical without a gradient exchange, and the prequential
metrics, sample count and digest are those of all the samples. Rank 0 writes the snapshots, whose
manifest holds the offsets of every partition; every rank resumes from them, so a crash or a rescale
of any rank loses nothing and trains nothing twice (torchrun restarts the ranks; they meet again in
the rendezvous and resume from the newest snapshot).

A rank with no partition, or none with data, still takes part in every round.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from gpu_trainer.base import Positions
from gpu_trainer.batch import Batch

T = TypeVar("T")

# Several torchrun agents (machines, pods) in one rendezvous share, by default, one store for every
# round, and each agent counts only its own restarts: after a rank was killed, the agent that restarted
# for the membership change and the one that restarted for the failure disagree on the count, and the
# new ranks read the dead ranks' addresses. Without the shared store, rank 0 hosts a new store each round.
class SharedStoreAcrossAgents(RuntimeError):
    """Ranks of several torchrun agents that share the rendezvous store: they would not meet again after a restart."""


SHARED_STORE_ACROSS_AGENTS = (
    "the ranks span several torchrun agents that share the rendezvous store (torch's default); set "
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in every agent's environment, so that each round of the rendezvous "
    "starts a store of its own and restarted ranks do not read the addresses of the ranks they replace")


@dataclass
class Round:
    """What one rank brings to a round."""

    batch: Batch  # the samples it polled that passed the checks (none sent when ranks exchange gradients)
    offsets: Positions  # the next offset of each partition it polled from
    dead_lettered: int  # rejects among what it polled
    idle_s: float  # how long it has polled nothing
    stop: bool  # it was asked to stop (SIGTERM, max samples)
    snapshot_due: bool = False  # by the clock (trainer.snapshot_every_s); rank 0's counts
    rows: int | None = None  # how many samples it polled; None: len(batch)
    newest_ms: int | None = None  # the newest sample's event time; None: batch's
    behind: bool = False  # its partitions hold records it has not polled yet (a backlog)
    publishing: bool = False  # a snapshot is still being written (rank 0's counts: a due one waits for it)

    def polled(self) -> tuple[int, int | None]:
        if self.rows is not None:
            return self.rows, self.newest_ms
        return len(self.batch), int(self.batch.event_time_ms.max()) if len(self.batch) else None

    def without_samples(self) -> Round:
        """This round for ranks that each learn from their own samples: counts instead of the batch."""
        rows, newest = self.polled()
        return replace(self, batch=self.batch.head(0), rows=rows, newest_ms=newest)


@dataclass
class Agreed:
    """What every rank takes from a round: the same on all of them."""

    batch: Batch  # every rank's samples, in rank order (none when ranks exchange gradients)
    offsets: Positions = field(default_factory=dict)
    dead_lettered: int = 0
    idle_s: float = 0.0  # the least idle rank's
    stop: bool = False
    snapshot_due: bool = False
    rows: int = 0  # every rank's samples
    newest_ms: int | None = None  # the newest of them
    behind: bool = False  # some rank still has a backlog
    publishing: bool = False  # rank 0 is still writing a snapshot


def combine(rounds: Sequence[Round]) -> Agreed:
    """The rounds of all ranks, in rank order, as one.

    >>> from gpu_trainer.batch import Columns
    >>> rows = [{"sample_id": f"s{k}", "user_id": "u", "item_id": "i", "features": [1.0], "label": 1,
    ...          "event_time": k, "feature_set": "v1"} for k in range(2)]
    >>> a = Round(Columns.from_records(rows).to_batch(8, 8), {("t", 0): 2}, 1, 5.0, False, True)
    >>> b = Round(Columns.from_records([], width=1).to_batch(8, 8), {}, 0, 9.0, True)
    >>> agreed = combine([a, b])
    >>> len(agreed.batch), agreed.offsets, agreed.dead_lettered, agreed.idle_s, agreed.stop, agreed.snapshot_due
    (2, {('t', 0): 2}, 1, 5.0, True, True)
    >>> agreed.behind, combine([a, replace(b, behind=True)]).behind
    (False, True)
    >>> counted = combine([a.without_samples(), b.without_samples()])
    >>> len(counted.batch), counted.rows, counted.newest_ms
    (0, 2, 1)
    """
    offsets: Positions = {}
    for r in rounds:
        offsets.update(r.offsets)
    polled = [r.polled() for r in rounds]
    newest = [t for _, t in polled if t is not None]
    return Agreed(Batch.concat([r.batch for r in rounds]), offsets, sum(r.dead_lettered for r in rounds),
                  min(r.idle_s for r in rounds), any(r.stop for r in rounds), rounds[0].snapshot_due,
                  sum(n for n, _ in polled), max(newest) if newest else None, any(r.behind for r in rounds),
                  rounds[0].publishing)


def process_group_backend(device: torch.device) -> str:
    """gloo for CPU tensors; with a GPU, NCCL for CUDA tensors (the gradients exchanged) beside it.
    The object collectives (each round's samples and offsets, the leader's values) stay on gloo: a
    process group of several backends takes the CPU one for them.

    >>> process_group_backend(torch.device("cpu"))
    'gloo'
    """
    if device.type == "cuda" and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int

    @classmethod
    def from_env(cls, timeout_s: float = 600.0, device: torch.device | None = None) -> Ranks | None:
        """The ranks torchrun started (its WORLD_SIZE, RANK, MASTER_ADDR/PORT); None for one process.
        `device`: the one the ranks train on (see `process_group_backend`)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return None
        if not dist.is_initialized():
            rank, timeout = int(os.environ["RANK"]), timedelta(seconds=timeout_s)
            agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
            if agent_hosts and int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1:
                raise SharedStoreAcrossAgents(SHARED_STORE_ACROSS_AGENTS)
            store: dist.Store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                                              is_master=rank == 0 and not agent_hosts, timeout=timeout)
            if agent_hosts:
                # The agent's store outlives a restart of the ranks: without a prefix of their own, ranks
                # restarted after one was killed read the dead ranks' addresses from it and cannot connect.
                # One agent restarts all of its ranks at once, so they agree on its restart count.
                attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
                store = dist.PrefixStore(f"rtrec-trainer/attempt-{attempt}", store)
            dist.init_process_group(process_group_backend(device or torch.device("cpu")), store=store, rank=rank,
                                    world_size=world, timeout=timeout)
        return cls(dist.get_rank(), dist.get_world_size())

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def partitions(self, count: int) -> list[int]:
        """This rank's share of `count` partitions.

        >>> Ranks(1, 3).partitions(8)
        [1, 4, 7]
        """
        return [p for p in range(count) if p % self.world == self.rank]

    def exchange(self, mine: Round) -> Agreed:
        """One collective a round: every rank's Round to every rank."""
        rounds: list[Round | None] = [None] * self.world
        dist.all_gather_object(rounds, mine)
        return combine([r for r in rounds if r is not None])

    def from_leader(self, value: T) -> T:
        """Rank 0's `value`, on every rank."""
        box: list[object] = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]  # type: ignore[return-value]

    def same_weights(self, arrays: dict[str, np.ndarray]) -> bool:
        """Whether every replica holds the same weights (compared by a checksum per array)."""
        sums = torch.tensor([float(np.float64(a.astype(np.float64).sum())) for _, a in sorted(arrays.items())],
                            dtype=torch.float64)
        lowest, highest = sums.clone(), sums.clone()
        dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
        dist.all_reduce(highest, op=dist.ReduceOp.MAX)
        return bool(torch.equal(lowest, highest))

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def all_gather_ragged(mine: torch.Tensor, lengths: Sequence[int]) -> list[list[torch.Tensor]]:
    """Every rank's 1-D `mine`, cut into parts of `lengths` (as many on every rank, of any size), in
    rank order: two tensor collectives (the lengths, then the data padded to the longest) on `mine`'s
    device, with no pickling."""
    world = dist.get_world_size()
    sizes = torch.tensor(list(lengths), dtype=torch.int64, device=mine.device)
    all_sizes = [torch.empty_like(sizes) for _ in range(world)]
    dist.all_gather(all_sizes, sizes)
    longest = max(int(s.sum()) for s in all_sizes)
    padded = torch.zeros(longest, dtype=mine.dtype, device=mine.device)
    padded[:len(mine)] = mine
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)
    return [list(torch.split(g[:int(s.sum())], s.tolist())) for g, s in zip(gathered, all_sizes, strict=True)]


class GradientExchange:
    """The ranks' StepExchange (gpu_trainer.exchange) over torch.distributed: every rank's gradients
    gathered and summed alike on every rank (the embedding tables' row-sparse ones row by row, a
    coalesce), the per-sample figures gathered as objects. Every rank ends a step with the same
    gradients, so the replicas stay identical."""

    distributed = True

    def gather(self, mine: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        parts: list[Mapping[str, np.ndarray] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, dict(mine))
        return {name: np.concatenate([p[name] for p in parts if p is not None]) for name in mine}

    def reduce_grads(self, params: Mapping[str, nn.Parameter], sparse: Collection[str]) -> None:
        """One gather of every rank's gradients (the dense ones flat, the tables' coalesced rows with
        their indices' bits carried as float32 pairs), summed on each rank alike, in rank order. One
        tensor gather in place of an all-reduce and a gather of pickled objects: fewer collectives,
        each with its own latency, and no pickling (README, "Ranks" under the trainer)."""
        dense = [p for name, p in params.items() if name not in sparse]
        names = [name for name in params if name in sparse]
        device = next(iter(params.values())).device
        tables = [None if (g := params[n].grad) is None else g.coalesce() for n in names]
        rows = [torch.zeros(0, dtype=torch.int64, device=device) if g is None else g.indices()[0] for g in tables]
        values = [torch.zeros(0, device=device) if g is None else g.values().float().reshape(-1) for g in tables]
        flat_dense = [torch.zeros(p.numel(), device=device) if p.grad is None else p.grad.float().reshape(-1)
                      for p in dense]
        parts = [*flat_dense, *(r.contiguous().view(torch.float32) for r in rows), *values]
        per_rank = all_gather_ragged(torch.cat(parts), [len(part) for part in parts])
        for k, p in enumerate(dense):
            p.grad = torch.stack([theirs[k] for theirs in per_rank]).sum(0).view_as(p).to(p.dtype)
        for t, name in enumerate(names):
            p = params[name]
            index = torch.cat([theirs[len(dense) + t] for theirs in per_rank]).view(torch.int64)
            value = torch.cat([theirs[len(dense) + len(names) + t] for theirs in per_rank]).view(-1, p.shape[1])
            p.grad = torch.sparse_coo_tensor(index.unsqueeze(0), value.to(p.dtype), p.shape,
                                             check_invariants=False).coalesce()
