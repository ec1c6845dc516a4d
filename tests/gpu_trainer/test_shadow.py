"""The shadow learners' gate on simulated score streams, and the "auto" row of `rtrec evaluate`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.settings import TrainerSettings
from gpu_trainer.shadow import ShadowGate
from rtrec.evaluation import compare
from tests.rtrec.test_peer_baseline import samples


def scores(labels: np.ndarray, skill: float, rng: np.random.Generator) -> np.ndarray:
    """Probabilities whose AUC grows with `skill` (0: chance)."""
    return 1 / (1 + np.exp(-(skill * (2 * labels - 1) + rng.normal(size=len(labels)))))


def run(gate: ShadowGate, skills: list[dict[str, float]], batches: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    leaders = []
    for phase in skills:
        for _ in range(batches):
            labels = (rng.random(500) < 0.3).astype(np.float64)
            leaders.append(gate.update({n: scores(labels, s, rng) for n, s in phase.items()}, labels))
    return leaders


def test_the_gate_follows_the_better_variant_when_the_stream_changes() -> None:
    gate = ShadowGate(["plain", "ewc"], window=5_000, margin=0.005)
    leaders = run(gate, [{"plain": 0.5, "ewc": 1.5}, {"plain": 1.5, "ewc": 0.5}], batches=60)
    assert leaders[59] == "ewc" and leaders[-1] == "plain"
    assert [(s["from"], s["to"]) for s in gate.switches] == [("plain", "ewc"), ("ewc", "plain")]
    # the second switch waits for the window to turn and the streak: not before the stream changed
    assert gate.switches[1]["samples"] > 60 * 500


@pytest.mark.parametrize("seed", range(5))
def test_variants_within_noise_of_each_other_do_not_flap(seed: int) -> None:
    """Equal variants (with independent noise, worse than real variants of one model): each one's AUC
    over 5,000 samples wanders by about 0.007; a 0.015 lead in two windows in a row is not noise."""
    gate = ShadowGate(["a", "b", "c"], window=5_000, margin=0.015)
    run(gate, [{"a": 1.0, "b": 1.0, "c": 1.0}], batches=200, seed=seed)
    assert gate.switches == []


def test_evaluate_serves_each_batch_by_the_variant_chosen_before_it() -> None:
    cfg = TrainerSettings().model_copy(update={"user_buckets": 1 << 10, "item_buckets": 1 << 8})
    results = compare(samples(), cfg, train_fraction=0.3, period_s=10 * 3600)
    auto = results[-1]
    variants = [r for r in results if r.name.startswith("real-time")]
    assert auto.name.startswith(f"auto (shadow learners: {len(variants)} variants, ")
    assert np.array_equal(auto.labels, results[0].labels) and len(auto.probs) == len(results[0].probs)
    # every served score is one a variant made for that sample before learning it
    stacked = np.stack([v.probs for v in variants])
    assert np.isclose(stacked, auto.probs).any(axis=0).all()
    assert auto.samples_per_s and auto.samples_per_s < min(v.samples_per_s or 0 for v in variants)


def test_the_trainer_service_publishes_the_leading_variant_and_resumes_every_variant(tmp_path: Path) -> None:
    from gpu_trainer.service import TrainerService
    from gpu_trainer.shadow import ShadowLearners
    from gpu_trainer.snapshots import SnapshotStore
    from tests.gpu_trainer.fakes import ListOutputs, ListSource, MemoryPointer
    from tests.gpu_trainer.samples import digest, make_samples
    from tests.gpu_trainer.test_service import config

    cfg = config(tmp_path, shadow_variants=("plain", "ema", "ewc"))
    first, second = make_samples(3000), make_samples(2000, start=3000)
    source = ListSource({0: first})
    trainer = TrainerService(cfg, source, ListOutputs(), MemoryPointer(), SnapshotStore(cfg.snapshot_dir))
    trainer.run(should_stop=lambda: source.lag() == 0)
    learners = trainer.learner
    assert isinstance(learners, ShadowLearners)
    manifest = trainer.store.manifest(trainer.store.latest_version())
    assert manifest.variant == learners.gate.leader and manifest.samples_seen == 3000
    assert {f"variant_auc.{n}" for n in ("plain", "ema", "ewc")} <= set(manifest.metrics)
    _, arrays = trainer.store.load(manifest.version)
    # the scorer's arrays are the leader's published weights; every variant's own state is kept beside them
    leader_state = learners.leader.published_state()
    assert all(np.array_equal(arrays[f"published/{k}"], v.cpu().numpy()) for k, v in leader_state.items())
    assert {k.split("/")[1] for k in arrays if k.startswith("variant/")} == {"plain", "ema", "ewc"}

    source = ListSource({0: first + second})  # resumed at the snapshot offsets: 3000
    resumed = TrainerService(cfg, source, ListOutputs(), MemoryPointer(), SnapshotStore(cfg.snapshot_dir))
    assert resumed.resume() == manifest.version
    assert isinstance(resumed.learner, ShadowLearners) and resumed.learner.gate.leader == manifest.variant
    for name, learner in resumed.learner.variants.items():
        saved = {k.removeprefix(f"variant/{name}/"): v for k, v in arrays.items() if k.startswith(f"variant/{name}/")}
        # a variant without EMA holds its trained weights as its published ones
        assert all(np.array_equal(saved.get(f"trained/{k}", saved[f"published/{k}"]), p.detach().cpu().numpy())
                   for k, p in learner.params.items()), name
    resumed.run(should_stop=lambda: source.lag() == 0)
    last = resumed.store.manifest(resumed.store.latest_version())
    assert last.samples_seen == 5000 and last.sample_digest == digest(first + second)
