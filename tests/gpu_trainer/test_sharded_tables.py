"""The sharded tables that `bench_trainer --only sharding` measures (benchmarks/sharded_tables.py) train
the model one process holding every row trains: two and three gloo ranks, each stepping on its own
share of every batch (uneven, and empty on one rank in one step), against one rank on all of it; the
replicated tables it measures them against, stepping on the same shares, make the same model; and
one rank of them is the trainer's MF under its optimisers."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.sharded_tables import ReplicatedMF, ShardedMF, initial_table, joined_table, load_joined_table
from gpu_trainer.models.mf import IncrementalMF
from gpu_trainer.updates.row_adam import RowSparseAdam

USERS, ITEMS, DENSE, DIM, STEPS, ROWS = 64, 48, 3, 4, 8, 96


def batches() -> list[tuple[torch.Tensor, ...]]:
    rng = np.random.default_rng(11)
    out = []
    for _ in range(STEPS):
        users = torch.from_numpy(rng.integers(0, USERS, ROWS))
        items = torch.from_numpy(rng.integers(0, ITEMS, ROWS))
        dense = torch.from_numpy(rng.exponential(3.0, (ROWS, DENSE)).astype(np.float32))
        label = torch.from_numpy(((users + items) % 3 == 0).numpy().astype(np.float32))
        out.append((users, items, dense, label))
    return out


def rank_main(rank: int, world: int, out: str, store: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    model = ShardedMF(USERS, ITEMS, DENSE, DIM, lr=0.05, dense_lr=0.05)
    replicated = ReplicatedMF(USERS, ITEMS, DENSE, DIM, lr=0.05, dense_lr=0.05)
    losses = []
    for k, batch in enumerate(batches()):
        cuts = np.linspace(0, ROWS, world + 1).astype(int) if world > 1 else np.array([0, ROWS])
        lo, hi = (cuts[rank], cuts[rank + 1]) if k != 3 else ((0, ROWS) if rank == world - 1 else (0, 0))
        losses.append(model.step(*(t[lo:hi] for t in batch), total=ROWS))
        replicated.step(*(t[lo:hi] for t in batch), total=ROWS)
    table = model.full_table()
    replicated_table = joined_table(replicated.model).numpy()
    dense = torch.cat([p.detach().reshape(-1) for p in model.dense.parameters()]).numpy()
    np.savez(os.path.join(out, f"w{world}r{rank}.npz"), table=table, dense=dense, losses=np.array(losses),
             replicated=replicated_table,
             sent=np.array(model.sent_bytes))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """One rank holding every row, stepping on all of every batch."""
    out = tmp_path_factory.mktemp("alone")
    mp.spawn(rank_main, args=(1, str(out), str(out / "store")), nprocs=1, join=True)
    return dict(np.load(out / "w1r0.npz"))


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_ranks_train_the_model_of_one_rank_holding_every_row(tmp_path: Path, world: int,
                                                                     alone: dict[str, np.ndarray]) -> None:
    mp.spawn(rank_main, args=(world, str(tmp_path), str(tmp_path / "store")), nprocs=world, join=True)
    ranks = [np.load(tmp_path / f"w{world}r{r}.npz") for r in range(world)]
    assert alone["table"].shape == (USERS + ITEMS, DIM + 1)
    for part in ranks:
        np.testing.assert_allclose(part["table"], alone["table"], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(part["dense"], alone["dense"], rtol=1e-4, atol=1e-6)
        # the trainer's way over the same shares (gradients gathered, tables whole) makes it too
        np.testing.assert_allclose(part["replicated"], alone["table"], rtol=1e-4, atol=1e-6)
        assert int(part["sent"]) > 0  # rows and gradients did cross between ranks
    summed = sum(part["losses"] for part in ranks)
    np.testing.assert_allclose(summed, alone["losses"], rtol=1e-4)
    moved = np.abs(alone["table"] - initial_table(USERS + ITEMS, DIM).numpy()).max(axis=1) > 0
    assert moved.sum() >= 0.5 * (USERS + ITEMS)  # the steps trained most rows, so equality says something



def test_one_rank_of_sharded_tables_is_the_trainers_mf(alone: dict[str, np.ndarray]) -> None:
    """The joined table trains as IncrementalMF's four tables do under the trainer's optimisers."""
    sharded = alone
    model = IncrementalMF(USERS, ITEMS, DENSE, DIM)
    load_joined_table(model, initial_table(USERS + ITEMS, DIM))
    tables = [model.user.weight, model.user_bias.weight, model.item.weight, model.item_bias.weight]
    optimizers = [RowSparseAdam(tables, lr=0.05), torch.optim.Adam(model.dense.parameters(), lr=0.05)]
    for users, items, dense, label in batches():
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        (torch.nn.functional.binary_cross_entropy_with_logits(model(users, items, dense), label, reduction="sum")
         / ROWS).backward()
        for opt in optimizers:
            opt.step()
    np.testing.assert_allclose(sharded["table"], joined_table(model).numpy(), rtol=1e-4, atol=1e-6)
    dense_weights = torch.cat([p.detach().reshape(-1) for p in model.dense.parameters()]).numpy()
    np.testing.assert_allclose(sharded["dense"], dense_weights, rtol=1e-4, atol=1e-6)
