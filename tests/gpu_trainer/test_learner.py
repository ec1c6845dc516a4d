"""The learner on synthetic streams: it learns, evaluates before learning, guards NaN, and EWC
keeps more of an earlier phase than plain training."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.settings import TrainerSettings
from gpu_trainer.batch import Columns
from gpu_trainer.learner import Learner
from gpu_trainer.models import build_model
from gpu_trainer.prequential import auc

BUCKETS = 4096


class TwoPhaseStream:
    """Phase 1: users x items 'a*' with tastes U1; phase 2: the same users x items 'b*' with other
    tastes U2. Plain training on phase 2 overwrites the user vectors that phase 1 needs."""

    def __init__(self, seed: int = 0, n_users: int = 300, n_items: int = 200, d: int = 4) -> None:
        rng = np.random.default_rng(seed)
        self.u = {1: rng.normal(size=(n_users, d)), 2: rng.normal(size=(n_users, d))}
        self.v = {1: rng.normal(size=(n_items, d)), 2: rng.normal(size=(n_items, d))}
        self.n_users, self.n_items = n_users, n_items
        self.counter = 0

    def draw(self, phase: int, n: int, rng: np.random.Generator) -> Columns:
        u, i = rng.integers(0, self.n_users, n), rng.integers(0, self.n_items, n)
        logit = 1.5 * (self.u[phase][u] * self.v[phase][i]).sum(1) - 1.0
        y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
        prefix = "a" if phase == 1 else "b"
        ids = np.array([f"s{self.counter + k}" for k in range(n)], dtype=object)
        self.counter += n
        return Columns(ids, np.array([f"u{k}" for k in u], dtype=object),
                       np.array([f"{prefix}{k}" for k in i], dtype=object), np.zeros((n, 2), np.float32),
                       np.full(n, 2), y, np.arange(n, dtype=np.int64), np.array(["v1"] * n, dtype=object))


def published_auc(learner: Learner, columns: Columns) -> float:
    model = build_model(learner.model_name, learner.config)
    model.load_state_dict(learner.published_state())
    batch = columns.to_batch(BUCKETS, BUCKETS)
    with torch.no_grad():
        probs = torch.sigmoid(model(batch.user_idx, batch.item_idx, batch.dense)).numpy()
    return auc(probs, columns.label)


def cfg(**kw: object) -> TrainerSettings:
    return TrainerSettings(user_buckets=BUCKETS, item_buckets=BUCKETS, embedding_dim=16, **kw)


def run_two_phases(ewc: bool, n1: int = 150_000, n2: int = 300_000, bs: int = 1024) -> tuple[float, float, float]:
    stream, rng = TwoPhaseStream(), np.random.default_rng(1)
    test1 = stream.draw(1, 20_000, np.random.default_rng(99))
    test2 = stream.draw(2, 20_000, np.random.default_rng(98))
    learner = Learner(cfg(ewc_enabled=ewc, ewc_lambda=1.0), n_dense=2)
    for phase, n in ((1, n1), (2, n2)):
        for k in range(n // bs):
            learner.step(stream.draw(phase, bs, rng).to_batch(BUCKETS, BUCKETS))
            if k % 100 == 99:  # a snapshot promotion consolidates EWC
                learner.consolidate()
        if phase == 1:
            after_phase1 = published_auc(learner, test1)
            learner.consolidate()
    return after_phase1, published_auc(learner, test1), published_auc(learner, test2)


def test_ewc_keeps_more_of_phase_one_at_comparable_phase_two_auc() -> None:
    plain = run_two_phases(ewc=False)
    ewc = run_two_phases(ewc=True)
    print(f"plain: phase-1 AUC {plain[0]:.4f} -> {plain[1]:.4f}, phase-2 AUC {plain[2]:.4f}")
    print(f"EWC:   phase-1 AUC {ewc[0]:.4f} -> {ewc[1]:.4f}, phase-2 AUC {ewc[2]:.4f}")
    assert plain[0] > 0.85 and ewc[0] > 0.85  # both learnt phase 1
    assert ewc[1] - plain[1] >= 0.02  # EWC forgets less
    assert plain[2] - ewc[2] <= 0.01  # at comparable phase-2 AUC


@pytest.mark.parametrize("model", ["mf", "deepfm"])
def test_learns_and_scores_before_learning(model: str) -> None:
    stream, rng = TwoPhaseStream(), np.random.default_rng(2)
    learner = Learner(cfg(model=model), n_dense=2)
    batch = stream.draw(1, 512, rng).to_batch(BUCKETS, BUCKETS)
    with torch.no_grad():
        before = torch.sigmoid(learner.model(batch.user_idx, batch.item_idx, batch.dense)).numpy()
    learner.step(batch)
    # the first step only shifts the output bias before scoring: the same ranking, up to float32 ties
    assert learner.prequential.history[0]["batch_auc"] == pytest.approx(auc(before.astype(np.float64),
                                                                            batch.label.numpy()), abs=1e-3)
    for _ in range(150):
        learner.step(stream.draw(1, 1024, rng).to_batch(BUCKETS, BUCKETS))
    assert learner.prequential.auc() > 0.8
    assert learner.samples_trained == 512 + 150 * 1024


def test_non_finite_loss_is_not_learned_from() -> None:
    stream, rng = TwoPhaseStream(), np.random.default_rng(3)
    learner = Learner(cfg(), n_dense=2)
    batch = stream.draw(1, 64, rng).to_batch(BUCKETS, BUCKETS)
    batch.dense[0, 0] = float("nan")
    before = {n: p.detach().clone() for n, p in learner.params.items()}
    result = learner.step(batch)
    assert not result.trained and learner.non_finite_batches == 1 and learner.samples_trained == 0
    assert all(torch.equal(before[n], p) for n, p in learner.params.items())
    assert learner.weights_are_finite()


def test_ema_moves_only_touched_rows_of_the_published_tables() -> None:
    stream, rng = TwoPhaseStream(), np.random.default_rng(4)
    learner = Learner(cfg(), n_dense=2)
    published_before = {n: t.clone() for n, t in learner.published_state().items()}
    batch = stream.draw(1, 32, rng).to_batch(BUCKETS, BUCKETS)
    learner.step(batch)
    after = learner.published_state()["user.weight"]
    changed = torch.nonzero((after != published_before["user.weight"]).any(dim=1)).flatten()
    assert set(changed.tolist()) <= set(batch.user_idx.unique().tolist())
    assert len(changed) > 0


def test_collision_rate_is_reported_per_table() -> None:
    from gpu_trainer.batch import hash_ids

    learner = Learner(TrainerSettings(user_buckets=16, item_buckets=1 << 16, embedding_dim=4), n_dense=2)
    stream, rng = TwoPhaseStream(n_users=300), np.random.default_rng(5)
    for _ in range(20):
        learner.step(stream.draw(1, 512, rng).to_batch(16, 1 << 16))
    users = learner.collisions["user"]
    assert users.distinct_ids == 300 and users.rate() == pytest.approx(1 - 16 / 300)
    expected_items = 1 - len(set((hash_ids([f"a{k}" for k in range(200)]) % np.uint64(1 << 16)).tolist())) / 200
    assert learner.collisions["item"].rate() == pytest.approx(expected_items)


@pytest.mark.parametrize("ema", [True, False])
@pytest.mark.parametrize("model", ["mf", "deepfm"])
def test_predict_scores_with_the_published_weights_as_a_loaded_snapshot_would(model: str, ema: bool) -> None:
    stream, rng = TwoPhaseStream(), np.random.default_rng(4)
    learner = Learner(cfg(model=model, ema_enabled=ema), n_dense=2)
    for _ in range(20):
        learner.step(stream.draw(1, 512, rng).to_batch(BUCKETS, BUCKETS))
    held_out = stream.draw(1, 2_000, np.random.default_rng(97))
    loaded = build_model(learner.model_name, learner.config).eval()
    loaded.load_state_dict(learner.published_state())
    batch = held_out.to_batch(BUCKETS, BUCKETS)
    with torch.no_grad():
        expected = torch.sigmoid(loaded(batch.user_idx, batch.item_idx, batch.dense)).numpy()
    np.testing.assert_allclose(learner.predict(batch), expected, rtol=1e-5, atol=1e-6)
    assert learner.model.training  # scoring leaves the trained model as it was


@pytest.mark.parametrize("ema", [True, False])
def test_state_arrays_restore_the_learner_and_hold_shared_weights_once(ema: bool) -> None:
    stream, rng = TwoPhaseStream(), np.random.default_rng(5)
    learner = Learner(cfg(ema_enabled=ema), n_dense=2)
    for _ in range(5):
        learner.step(stream.draw(1, 512, rng).to_batch(BUCKETS, BUCKETS))
    arrays = learner.state_arrays()
    names = set(learner.params)
    # without EMA the trained weights are the published ones: written once
    assert {k for k in arrays if k.startswith("trained/")} == ({f"trained/{n}" for n in names} if ema else set())
    assert {k for k in arrays if k.startswith("published/")} == {f"published/{n}" for n in names}
    restored = Learner(cfg(ema_enabled=ema), n_dense=2)
    restored.load_state_arrays({k: v.copy() for k, v in arrays.items()})
    assert all(torch.equal(restored.params[n], learner.params[n]) for n in names)
    assert all(torch.equal(restored.published_state()[n], learner.published_state()[n]) for n in names)
    # a snapshot written before (trained/ beside published/ without EMA) restores the trained ones
    older = {**{k: v.copy() for k, v in arrays.items()},
             **{f"trained/{n}": learner.params[n].detach().numpy().copy() for n in names}}
    again = Learner(cfg(ema_enabled=ema), n_dense=2)
    again.load_state_arrays(older)
    assert all(torch.equal(again.params[n], learner.params[n]) for n in names)
