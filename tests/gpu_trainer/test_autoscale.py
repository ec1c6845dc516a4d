"""`rtrec train autoscale`'s controller against the real broker with real torchrun ranks: it reads the
trainer group's lag from Kafka and takes the ranks 2 -> 3 -> 2 while samples keep coming; the final
snapshot has trained every sample exactly once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from core.kafka import ensure_topics
from core.settings import AutoscaleSettings, Settings
from gpu_trainer.scaling import ScalingPolicy
from gpu_trainer.snapshots import SnapshotStore
from rtrec.autoscale import Autoscaler, TrainerRanks
from tests.faults.runs import env_of
from tests.gpu_trainer.samples import digest, make_samples, produce_samples
from tests.gpu_trainer.test_service_kafka import trainer_settings

pytestmark = pytest.mark.integration


def trained(s: Settings) -> int:
    store = SnapshotStore(s.trainer.snapshot_dir)
    version = store.latest_version()
    return 0 if version is None else store.manifest(version).samples_seen


def wait_trained(s: Settings, n: int, log: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while trained(s) < n and time.monotonic() < deadline:
        time.sleep(0.5)
    assert trained(s) == n, log.read_text()[-4000:]


def wait_committed(scaler: Autoscaler, log: Path, timeout_s: float = 60) -> None:
    """Rank 0 commits a snapshot's offsets after publishing it (step 5), so the group's lag reaches 0
    a moment after the snapshot shows every sample trained."""
    deadline = time.monotonic() + timeout_s
    while scaler.lag()[0] > 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert scaler.lag()[0] == 0, log.read_text()[-4000:]


def test_the_controller_takes_the_ranks_2_3_2_mid_stream_and_every_sample_is_trained_once(
        settings: Settings, tmp_path: Path) -> None:
    s = trainer_settings(settings.namespaced("autoscale"), tmp_path, snapshot_every_s=1.0,
                         group_id=f"trainer-autoscale-{tmp_path.name}")
    ensure_topics(s.kafka.bootstrap_servers, [s.kafka.topics.samples], 3)
    log = tmp_path / "agents.log"
    ranks = TrainerRanks(env_of(s), log)
    policy = ScalingPolicy(AutoscaleSettings(lag_per_worker=1000, min_workers=2, max_workers=3, up_cooldown_s=0,
                                             down_cooldown_s=0))
    scaler = Autoscaler(s, ranks, policy)
    phases = [make_samples(n, seed=k, start=10_000 * k) for k, n in enumerate((1500, 3500, 2000))]
    try:
        produce_samples(s, phases[0])
        assert scaler.tick(0.0).workers == 2  # lag 1500: the fewest
        wait_trained(s, 1500, log)
        produce_samples(s, phases[1])
        up = scaler.tick(100.0)  # lag 3500 calls for 4, capped by the 3 partitions
        assert (up.workers, up.changed) == (3, True), up
        wait_trained(s, 5000, log)
        wait_committed(scaler, log)
        down = scaler.tick(200.0)  # no lag: back to the fewest
        assert (down.workers, down.changed) == (2, True), down
        produce_samples(s, phases[2])
        wait_trained(s, 7000, log)
    finally:
        ranks.stop()
    text = log.read_text()
    # torchrun itself ends non-zero after a SIGTERM; its ranks finished their last round and exited cleanly
    assert "rank 0 of 2: trained 7000 samples" in text and "rank 1 of 2: trained 7000 samples" in text, text[-4000:]
    assert "rank 2 of 3 consumes partitions [2]" in text, text[-4000:]
    store = SnapshotStore(s.trainer.snapshot_dir)
    final = store.manifest(store.latest_version())
    everything = [sample for phase in phases for sample in phase]
    assert (final.samples_seen, final.sample_digest) == (7000, digest(everything))
    assert sum(o["offset"] for o in final.offsets) == 7000
    assert [d.workers for _, _, d in scaler.decisions] == [2, 3, 2]
