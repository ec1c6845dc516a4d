"""Ranks that each step on their own samples and exchange gradients (trainer.rank_exchange =
"gradients") make the model one process makes stepping on all the samples: two gloo ranks, spawned
here, against one learner, with EMA, EWC and the din model's tables in play."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from core.settings import TrainerSettings
from gpu_trainer.batch import Columns
from gpu_trainer.distributed import GradientExchange
from gpu_trainer.learner import Learner
from tests.gpu_trainer.samples import signal_records

CFG = TrainerSettings(model="din", history_length=5, user_buckets=1 << 12, item_buckets=1024, embedding_dim=8,
                      lr=0.05, ema_enabled=True, ewc_enabled=True, published_eval_rows=64)
STEPS, ROWS = 12, 128


def batches() -> list[Columns]:
    rng = np.random.default_rng(5)
    return [Columns.from_records(signal_records(ROWS, rng, k * ROWS, "type"), width=2, history_length=5)
            for k in range(STEPS)]


def learn(learner: Learner, parts: list[Columns]) -> None:
    for k, part in enumerate(parts):
        learner.step(part.to_batch(CFG.user_buckets, CFG.item_buckets))
        if k % 4 == 3:
            learner.consolidate()


def rank_main(rank: int, world: int, out: str, store: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    learner = Learner(CFG, n_dense=2, device=torch.device("cpu"), exchange=GradientExchange())
    # rank r's share of every batch: a different number of rows on each rank, none at all in one step
    cuts = [(0, ROWS // 3), (ROWS // 3, ROWS)]
    shares = []
    for k, part in enumerate(batches()):
        lo, hi = cuts[rank] if k != 5 else ((0, 0) if rank == 0 else (0, ROWS))
        shares.append(part.select(np.arange(lo, hi)))
    learn(learner, shares)
    np.savez(os.path.join(out, f"rank{rank}.npz"), **learner.state_arrays(),
             samples=np.array(learner.samples_trained), digest=np.array(learner.sample_digest, dtype=np.uint64),
             auc=np.array(learner.prequential.auc()))
    dist.destroy_process_group()


def test_two_ranks_exchanging_gradients_make_the_model_of_one_process(tmp_path: Path) -> None:
    mp.spawn(rank_main, args=(2, str(tmp_path), str(tmp_path / "store")), nprocs=2, join=True)
    alone = Learner(CFG, n_dense=2, device=torch.device("cpu"))
    learn(alone, batches())
    expected = alone.state_arrays()
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    for name, value in expected.items():
        assert np.array_equal(ranks[0][name], ranks[1][name]), name  # the replicas are identical
        np.testing.assert_allclose(ranks[0][name], value, rtol=1e-4, atol=1e-5, err_msg=name)  # sums in another order
    assert int(ranks[0]["samples"]) == STEPS * ROWS == alone.samples_trained
    assert int(ranks[0]["digest"]) == alone.sample_digest
    assert abs(float(ranks[0]["auc"]) - (alone.prequential.auc() or 0.0)) < 1e-6
