"""The demo's comparison of the real-time model with its frozen first snapshot: the same samples, the
same buckets of event time, for both."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from core.settings import TrainerSettings
from gpu_trainer.prequential import ScoreLog, auc
from gpu_trainer.scoring import load_snapshot
from gpu_trainer.service import TrainerService
from gpu_trainer.snapshots import SnapshotStore
from rtrec.reports import Freshness, compare_with_frozen, demo_plots
from tests.gpu_trainer.fakes import ListOutputs, ListSource, MemoryPointer
from tests.gpu_trainer.samples import make_samples


def test_both_models_are_scored_on_the_same_samples_per_bucket(tmp_path: Path) -> None:
    cfg = TrainerSettings(snapshot_dir=tmp_path / "snapshots", user_buckets=4096, item_buckets=4096, batch_size=200,
                          batch_timeout_ms=0, lr=0.05, dense_lr=0.05, snapshot_every_samples=1000,
                          snapshot_every_s=3600.0, eval_window=2000, keep_last=100)
    trained = make_samples(6000)
    source = ListSource({0: trained})
    trainer = TrainerService(cfg, source, ListOutputs(), MemoryPointer(), SnapshotStore(cfg.snapshot_dir))
    log = ScoreLog()
    trainer.learner.score_log = log
    trainer.run(should_stop=lambda: source.lag() == 0)
    never_read = make_samples(300, seed=1, start=6000)  # in the topic, but the run ended before them

    store = SnapshotStore(cfg.snapshot_dir)
    first = trainer.promoted[0]
    c = compare_with_frozen(store, first, trained + never_read, log.arrays(), buckets=5)

    newest = store.manifest(first).newest_event_ms
    after = [r for r in trained if r["event_time"] > newest]
    assert 0 < len(after) < len(trained)
    assert (c.frozen_version, c.samples, c.unscored) == (first, len(after), 300)
    assert sum(b.samples for b in c.buckets) == len(after) and len(c.buckets) == 5
    scored = log.arrays()
    assert len(scored["score"]) == len(trained)  # every sample once
    frozen = load_snapshot(store, first)
    for b in c.buckets:  # recomputed by event time (the comparison matches the log by sample id)
        in_log = (scored["time_ms"] > newest) & (scored["time_ms"] >= b.start_ms) & (scored["time_ms"] < b.end_ms)
        assert in_log.sum() == b.samples
        assert b.realtime == auc(scored["score"][in_log], scored["label"][in_log])
        mine = [r for r in after if b.start_ms <= r["event_time"] < b.end_ms]
        labels = np.array([r["label"] for r in mine], dtype=np.float64)
        expected = auc(frozen.score_samples(mine).astype(np.float64), labels)
        assert b.frozen is not None and expected is not None and abs(b.frozen - expected) < 1e-9
    # on this stream the model keeps learning after its first snapshot
    assert c.realtime_auc is not None and c.frozen_auc is not None and c.realtime_auc > c.frozen_auc

    paths = demo_plots(c, Freshness.of([2500, 3000, 6100], [3, 60, 0], 2000, [2300, 2400, 5000]), tmp_path / "plots")
    assert [p.name for p in paths] == ["auc_over_time.png", "feature_freshness.png"]
    assert all(p.stat().st_size > 5000 for p in paths)
