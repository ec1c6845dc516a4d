"""`kill -9` during a run, restart: the samples trained equal the samples produced, none twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from core.settings import Settings
from gpu_trainer.snapshots import SnapshotStore
from tests.gpu_trainer.samples import digest, make_samples, produce_samples
from tests.gpu_trainer.test_service_kafka import env_of

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parents[2]


def start_trainer(env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rtrec", "train", "run", "--idle-exit", "4"], cwd=ROOT,
                            env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT)


def test_kill_9_mid_run_then_restart_trains_each_sample_exactly_once(settings: Settings, tmp_path: Path) -> None:
    snapshots = tmp_path / "snapshots"
    s = settings.model_copy(update={"trainer": settings.trainer.model_copy(update={"snapshot_dir": snapshots})})
    env = {**env_of(s), "RTREC_TRAINER__USER_BUCKETS": "4096", "RTREC_TRAINER__ITEM_BUCKETS": "4096",
           "RTREC_TRAINER__BATCH_SIZE": "500", "RTREC_TRAINER__SNAPSHOT_EVERY_SAMPLES": "3000",
           "RTREC_TRAINER__SNAPSHOT_EVERY_S": "60", "RTREC_TRAINER__GROUP_ID": f"kill-{tmp_path.name}"}
    samples = make_samples(40_000)
    produce_samples(s, samples[:2000])  # the topic exists before the trainer subscribes

    def produce_slowly() -> None:
        for start in range(2000, len(samples), 2000):
            produce_samples(s, samples[start:start + 2000])
            time.sleep(0.3)

    producer = threading.Thread(target=produce_slowly)
    log = tmp_path / "trainer.log"
    first = start_trainer(env, log)
    producer.start()
    store = SnapshotStore(snapshots)
    deadline = time.monotonic() + 90
    while len(store.versions()) < 2 and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.05)
    assert len(store.versions()) >= 2, log.read_text()[-3000:]
    first.send_signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    killed_at = store.manifest(store.latest_version()).samples_seen
    assert killed_at < len(samples)

    producer.join()
    second = start_trainer(env, log)
    assert second.wait(120) == 0, log.read_text()[-3000:]
    final = store.manifest(store.latest_version())
    assert final.samples_seen == len(samples)
    assert final.sample_digest == digest(samples)
    assert sum(o["offset"] for o in final.offsets) == len(samples)
    assert "resumed from snapshot v" in log.read_text()
