"""The trainer service's logic with in-memory I/O (tests/gpu_trainer/fakes.py): no broker, no Redis.
The same service against Kafka and Redis: test_service_kafka.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from core.settings import TrainerSettings
from gpu_trainer.service import TrainerService
from gpu_trainer.snapshots import SnapshotStore
from schemas.dead_letter import Reject
from tests.gpu_trainer.fakes import TOPIC, ListOutputs, ListSource, MemoryPointer
from tests.gpu_trainer.samples import digest, make_samples


def config(tmp_path: Path, **kw: object) -> TrainerSettings:
    return TrainerSettings(**{"snapshot_dir": tmp_path / "snapshots", "user_buckets": 4096, "item_buckets": 4096,
                              "batch_size": 200, "batch_timeout_ms": 0, "lr": 0.05, "dense_lr": 0.05,
                              "snapshot_every_samples": 1000, "snapshot_every_s": 3600.0, "eval_window": 2000,
                              **kw})


def service(cfg: TrainerSettings, source: ListSource, pointer: MemoryPointer | None = None,
            outputs: ListOutputs | None = None) -> TrainerService:
    return TrainerService(cfg, source, outputs or ListOutputs(), pointer or MemoryPointer(),
                          SnapshotStore(cfg.snapshot_dir))


def test_trains_every_sample_once_and_dead_letters_the_rest(tmp_path: Path) -> None:
    good = make_samples(3000)
    bad = [dict(make_samples(1, start=9000)[0], features=[math.nan] * 20),
           dict(make_samples(1, start=9001)[0], features=[1.0, 2.0]),
           dict(make_samples(1, start=9002)[0], label=3)]
    source = ListSource({0: good[:1500] + bad[:2], 1: [Reject("undecodable", value=b"\x00")] + good[1500:] + bad[2:]})
    outputs, pointer = ListOutputs(), MemoryPointer()
    trainer = service(config(tmp_path), source, pointer, outputs)
    summary = trainer.run(should_stop=lambda: source.lag() == 0)

    assert summary.samples_trained == 3000 and summary.dead_lettered == 4
    last = trainer.store.manifest(trainer.store.latest_version())
    assert last.sample_digest == digest(good)
    assert {(o["partition"], o["offset"]) for o in last.offsets} == {(0, 1502), (1, 1502)}
    reasons = sorted(r.reason for r in outputs.dead)
    assert any("s9000" in r and "non-finite" in r for r in reasons)
    assert any("expected 20 features, got 2" in r for r in reasons)
    assert any("s9002" in r and "label 3" in r for r in reasons)
    assert any(r == "undecodable" for r in reasons)
    assert [a["version"] for a in outputs.announced] == summary.snapshots
    assert pointer.current == summary.promoted[-1]
    assert source.commits[-1] == {(TOPIC, 0): 1502, (TOPIC, 1): 1502} and source.closed


def test_restart_resumes_from_the_snapshot_offsets(tmp_path: Path) -> None:
    cfg, samples = config(tmp_path), make_samples(4000)
    partitions = {0: samples[:2000], 1: samples[2000:]}
    first = service(cfg, ListSource(partitions)).run(max_samples=1000)
    assert 1000 <= first.samples_trained < 4000

    source = ListSource(partitions)
    second = service(cfg, source)
    assert second.resume() == first.snapshots[-1]
    summary = second.run(should_stop=lambda: source.lag() == 0)
    assert source.started_at == SnapshotStore(cfg.snapshot_dir).manifest(first.snapshots[-1]).offsets_by_partition()
    assert summary.samples_trained == 4000
    store = SnapshotStore(cfg.snapshot_dir)
    assert store.manifest(store.latest_version()).sample_digest == digest(samples)


def test_checkpoint_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = service(config(tmp_path), ListSource({0: []}))
    calls: list[str] = []
    for obj, name, label in [(trainer.store, "write", "snapshot files"), (trainer.outputs, "announce", "announcement"),
                             (trainer.pointer, "set_current", "pointer"),
                             (trainer.learner, "consolidate", "ewc consolidate"),
                             (trainer.source, "commit", "offsets commit"), (trainer.store, "prune", "prune")]:
        real = getattr(obj, name)
        monkeypatch.setattr(obj, name, lambda *a, _real=real, _label=label, **k: (calls.append(_label),
                                                                                  _real(*a, **k))[1])
    trainer.positions = {(TOPIC, 0): 0}
    assert trainer.checkpoint().promoted
    trainer.publisher.finish()
    assert calls == ["ewc consolidate", "snapshot files", "announcement", "pointer", "offsets commit", "prune"]


def _scores(prequential: object, auc_wanted: float, n: int = 1000) -> None:
    """Feeds `n` scored samples whose AUC is about `auc_wanted` (scores = label mixed with noise)."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, n).astype(np.float64)
    noise = rng.random(n)
    mix = 2 * (auc_wanted - 0.5)  # 0: pure noise (0.5), 1: the label itself (1.0)
    prequential.update(np.where(rng.random(n) < mix, labels, noise), labels)  # type: ignore[attr-defined]


def test_the_gate_judges_the_weights_it_publishes(tmp_path: Path) -> None:
    """The trained weights score well, the published (EMA) ones badly: the snapshot of those published
    weights must not replace a better current one, whatever the trained weights' AUC."""
    trainer = service(config(tmp_path, promotion_margin=0.02), ListSource({0: []}))
    learner = trainer.learner
    assert learner.published_prequential is not learner.prequential  # EMA on: two sets of scores
    _scores(learner.published_prequential, 0.80)
    _scores(learner.prequential, 0.80)
    trainer.positions = {(TOPIC, 0): 0}
    first = trainer.checkpoint()
    assert first is not None and first.promoted
    trainer.publisher.finish()

    learner.published_prequential = type(learner.published_prequential)(learner.cfg.eval_window)
    learner.prequential = type(learner.prequential)(learner.cfg.eval_window)
    _scores(learner.published_prequential, 0.60)
    _scores(learner.prequential, 0.95)
    second = trainer.checkpoint()
    trainer.publisher.finish()
    assert second is not None and not second.promoted
    assert second.metrics["auc"] == pytest.approx(learner.published_prequential.auc())
    assert second.metrics["trained_auc"] == pytest.approx(learner.prequential.auc())
    assert second.metrics["trained_auc"] > first.metrics["auc"] > second.metrics["auc"]
    assert trainer.pointer.current_version() == first.version


def test_published_scores_come_from_the_published_weights(tmp_path: Path) -> None:
    """With a slow EMA the published weights are not the trained ones, and neither are their scores."""
    cfg = config(tmp_path, ema_momentum=0.999)
    source = ListSource({0: make_samples(4000)})
    trainer = service(cfg, source)
    trainer.run(should_stop=lambda: source.lag() == 0)
    last = trainer.store.manifest(trainer.store.latest_version())
    assert abs(last.metrics["trained_auc"] - last.metrics["auc"]) > 0.005
    assert last.metrics["auc"] == pytest.approx(trainer.learner.published_prequential.auc())


def test_without_ema_the_published_weights_are_the_trained_ones(tmp_path: Path) -> None:
    source = ListSource({0: make_samples(1200)})
    trainer = service(config(tmp_path, ema_enabled=False), source)
    trainer.run(should_stop=lambda: source.lag() == 0)
    assert trainer.learner.published_prequential is trainer.learner.prequential
    last = trainer.store.manifest(trainer.store.latest_version())
    assert last.metrics["auc"] == last.metrics["trained_auc"]
