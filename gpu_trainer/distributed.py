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
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TypeVar

import numpy as np
import torch
import torch.distributed as dist

from gpu_trainer.base import Positions
from gpu_trainer.batch import Batch

T = TypeVar("T")


@dataclass
class Round:
    """What one rank brings to a round."""

    batch: Batch  # the samples it polled that passed the checks
    offsets: Positions  # the next offset of each partition it polled from
    dead_lettered: int  # rejects among what it polled
    idle_s: float  # how long it has polled nothing
    stop: bool  # it was asked to stop (SIGTERM, max samples)
    snapshot_due: bool = False  # by the clock (trainer.snapshot_every_s); rank 0's counts


@dataclass
class Agreed:
    """What every rank takes from a round: the same on all of them."""

    batch: Batch
    offsets: Positions = field(default_factory=dict)
    dead_lettered: int = 0
    idle_s: float = 0.0  # the least idle rank's
    stop: bool = False
    snapshot_due: bool = False


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
    """
    offsets: Positions = {}
    for r in rounds:
        offsets.update(r.offsets)
    return Agreed(Batch.concat([r.batch for r in rounds]), offsets, sum(r.dead_lettered for r in rounds),
                  min(r.idle_s for r in rounds), any(r.stop for r in rounds), rounds[0].snapshot_due)


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int

    @classmethod
    def from_env(cls, timeout_s: float = 600.0) -> Ranks | None:
        """The ranks torchrun started (its WORLD_SIZE, RANK, MASTER_ADDR/PORT); None for one process."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return None
        if not dist.is_initialized():
            rank, timeout = int(os.environ["RANK"]), timedelta(seconds=timeout_s)
            agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                                  is_master=rank == 0 and not agent_hosts, timeout=timeout)
            # The agent's store outlives a restart of the ranks: without a prefix of their own, ranks
            # restarted after one was killed read the dead ranks' addresses from it and cannot connect.
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            dist.init_process_group("gloo", store=dist.PrefixStore(f"rtrec-trainer/attempt-{attempt}", store),
                                    rank=rank, world_size=world, timeout=timeout)
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
