"""Kafka stopped for 30 s in the middle of a run, then started again on the same data: the feature job,
the loader (both in `rtrec features run`) and the trainer (`rtrec train run`) ride it out. Compared with a
run of the same events that nothing interrupted: the same windows (none twice), the same Redis contents,
the same training samples (none twice), and the trainer trained each of them exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.kafka import group_lag
from core.settings import Settings
from gpu_trainer.snapshots import SnapshotStore
from rtrec.services.kafka_broker import KafkaBroker
from schemas.kafka_io import read_topic
from tests.faults.runs import SETTLED_MS, redis_contents, reference_run, rtrec_process, windows
from tests.faults.test_trainer_faults import wait_until
from tests.flink_jobs.harness import create_topics, event, job_settings, produce, wait_for
from tests.gpu_trainer.samples import digest
from tests.gpu_trainer.test_service_kafka import trainer_settings
from tests.infra import local_services_settings

pytestmark = [pytest.mark.integration, pytest.mark.faults]
OUTAGE_S = 30

PHASE1 = [event(f"a{k}", "click" if k % 3 == 0 else "impression", f"u{k % 5}", f"i{(k // 3) % 4}", 200 * k)
          for k in range(300)]
PHASE2 = [event(f"b{k}", "click" if k % 3 == 0 else "impression", f"u{k % 6}", f"i{(k // 3) % 3}",
                60_000 + 200 * k) for k in range(200)]
PHASE2 += [event("flush", "impression", "flush-user", "flush-item", 160_000)]


@pytest.fixture
def own_kafka(tmp_path: Path) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(local_services_settings(tmp_path / "kafka-state"))
    broker.start()
    yield broker
    if broker.pid() is not None:
        broker.stop()


def run_settings(settings: Settings, run: str, tmp_path: Path, bootstrap: str | None = None) -> Settings:
    s = settings.namespaced(f"{run}-{uuid.uuid4().hex[:6]}")
    if bootstrap:
        s = s.model_copy(update={"kafka": s.kafka.model_copy(update={"bootstrap_servers": bootstrap})})
    s = job_settings(s, checkpoint_dir=tmp_path / run / "checkpoints", log_dir=tmp_path / "flink-logs",
                     attribution_window_s=5, checkpoint_interval_ms=3000)
    return trainer_settings(s, tmp_path / run, group_id=s.trainer.group_id)


def settled_samples(s: Settings) -> list[tuple]:
    got = read_topic(s.kafka.bootstrap_servers, s.kafka.topics.samples, "TrainingSample").records
    return sorted((r["sample_id"], r["label"]) for r in got if r["event_time"] < SETTLED_MS)


def describe_difference(got: dict, expected: dict) -> str:
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    changed = sorted(k for k in set(got) & set(expected) if got[k] != expected[k])
    first = changed[0] if changed else None
    return (f"{len(missing)} keys missing {missing[:3]}, {len(extra)} extra {extra[:3]}, {len(changed)} differ"
            + (f": {first!r} {got[first]!r} != {expected[first]!r}" if first else ""))


def what_went_on(s: Settings, log: Path, job: subprocess.Popen) -> str:
    """For a failure's message: whether `features run` still runs, its loader's lag per partition, the
    job's state changes and failures from Flink's log, and the end of the processes' log (librdkafka's
    connection noise left out)."""
    lines = [line for line in log.read_text().splitlines() if "Connect to ipv4" not in line]
    flink = list(dict.fromkeys(  # the job's state changes and each distinct exception once
        line[:300] for path in sorted(s.flink.log_dir.glob("*.log"))
        for line in path.read_text(errors="replace").splitlines()
        if "switched from" in line and "Job " in line or "Exception:" in line))
    return (f"\nfeatures run: {'running' if job.poll() is None else f'exited {job.returncode}'}; loader lag "
            f"{group_lag(s.kafka.bootstrap_servers, s.flink.loader_group_id, s.kafka.topics.features)}\n"
            + "Flink's log:\n" + "\n".join(flink[-15:]) + "\nthe processes' log:\n" + "\n".join(lines[-40:]))


def test_kafka_stopped_for_30_s_mid_run_loses_nothing_and_doubles_nothing(
        settings: Settings, tmp_path: Path, own_kafka: KafkaBroker) -> None:
    reference = run_settings(settings, "ref", tmp_path)
    expected = reference_run(reference, PHASE1 + PHASE2, with_samples=True)
    expected_samples = settled_samples(reference)
    assert len(expected.windows) > 100 and len(expected_samples) > 100
    assert sum(label for _, label in expected_samples) > 10

    s = run_settings(settings, "outage", tmp_path, bootstrap=own_kafka.bootstrap)
    create_topics(s)
    produce(s, PHASE1)
    log = tmp_path / "outage.log"
    job = rtrec_process(s, log, "features", "run")
    trainer = rtrec_process(s, log, "train", "run")
    try:
        wait_for(s, s.kafka.topics.features, "FeatureRecord", lambda got: len(got.records) > 20, timeout_s=120)
        own_kafka.stop()
        time.sleep(OUTAGE_S)
        assert job.poll() is None and trainer.poll() is None, log.read_text()[-3000:]
        own_kafka.start()
        produce(s, PHASE2)
        got = wait_for(s, s.kafka.topics.features, "FeatureRecord", timeout_s=240,
                       done=lambda batch: len(windows(batch.records)) >= len(expected.windows))
        deadline = time.monotonic() + 60
        while (now := redis_contents(s)) != expected.redis and time.monotonic() < deadline:
            time.sleep(1)
        assert now == expected.redis, describe_difference(now, expected.redis) + what_went_on(s, log, job)
        wait_until(lambda: settled_samples(s) == expected_samples, 60, "the uninterrupted run's samples", log)
        for process in (job, trainer):
            process.send_signal(signal.SIGTERM)
        assert job.wait(60) == 0 and trainer.wait(60) == 0, log.read_text()[-3000:]
    finally:
        for process in (job, trainer):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    keys = [w[:4] for w in windows(got.records)]
    assert len(keys) == len(set(keys)), "a window was sent twice"
    assert windows(got.records) == expected.windows

    samples = read_topic(s.kafka.bootstrap_servers, s.kafka.topics.samples, "TrainingSample").records
    assert len({r["sample_id"] for r in samples}) == len(samples), "a sample was sent twice"
    # the trainer stopped cleanly; once more, it trains what may have come after its last snapshot
    trainer = rtrec_process(s, log, "train", "run", "--idle-exit", "4")
    assert trainer.wait(120) == 0, log.read_text()[-3000:]
    store = SnapshotStore(s.trainer.snapshot_dir)
    final = store.manifest(store.latest_version())
    assert (final.samples_seen, final.sample_digest) == (len(samples), digest(samples))
    assert read_topic(s.kafka.bootstrap_servers, s.kafka.topics.dead_letter, "DeadLetter").records == []
