"""Faults injected into the trainer against the real broker, Redis and filesystem, each compared with
what a clean run of the same samples gives: every good sample trained once (count and digest), each
poison sample dead-lettered once."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from core.kafka import ensure_topics
from core.settings import Settings
from gpu_trainer.service import TrainerService
from gpu_trainer.snapshots import SnapshotStore
from rtrec.cli.main import cli
from schemas.kafka_io import read_topic
from tests.gpu_trainer.samples import digest, make_samples, produce_samples
from tests.gpu_trainer.snapshot_damage import DAMAGE, pickled_objects
from tests.gpu_trainer.test_service_kafka import env_of, trainer_settings

pytestmark = [pytest.mark.integration, pytest.mark.faults]
ROOT = Path(__file__).parents[2]


def start_trainer(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rtrec", "train", "run", *args], cwd=ROOT,
                            env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT)


def subprocess_env(s: Settings, tmp_path: Path, **trainer: str) -> dict[str, str]:
    return {**env_of(s), "RTREC_TRAINER__USER_BUCKETS": "4096", "RTREC_TRAINER__ITEM_BUCKETS": "4096",
            "RTREC_TRAINER__BATCH_SIZE": "500", "RTREC_TRAINER__GROUP_ID": f"faults-{tmp_path.name}",
            "RTREC_TRAINER__INSTANCE_ID": f"faults-{tmp_path.name}", **trainer}


def wait_until(condition: object, timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.05)
    assert condition(), f"{what} did not happen within {timeout_s}s:\n{log.read_text()[-3000:]}"  # type: ignore


def test_poison_samples_are_dead_lettered_once_across_a_kill_9(settings: Settings, tmp_path: Path) -> None:
    s = trainer_settings(settings, tmp_path)
    good = make_samples(12_000)
    poison = [dict(make_samples(1, start=90_000)[0], features=[1.0] * 50),  # over-long: once crashed every batch
              dict(make_samples(1, start=90_001)[0], features=[math.nan] * 20),
              dict(make_samples(1, start=90_002)[0], label=7)]
    # one partition, snapshots every 4,000 samples: the poison sits right after the first snapshot
    ensure_topics(s.kafka.bootstrap_servers, [s.kafka.topics.samples], partitions=1)
    produce_samples(s, good[:4000])
    produce_samples(s, poison)
    raw = Producer({"bootstrap.servers": s.kafka.bootstrap_servers})
    raw.produce(s.kafka.topics.samples, value=b"\x00 not avro", key=b"u1")
    raw.flush(10)
    produce_samples(s, good[4000:6000])
    env = subprocess_env(s, tmp_path, RTREC_TRAINER__SNAPSHOT_EVERY_SAMPLES="4000",
                         RTREC_TRAINER__SNAPSHOT_EVERY_S="600")
    log = tmp_path / "trainer.log"
    store = SnapshotStore(s.trainer.snapshot_dir)

    def dead_letters() -> list[dict]:
        return read_topic(s.kafka.bootstrap_servers, s.kafka.topics.dead_letter, "DeadLetter", timeout_s=10).records

    first = start_trainer(env, log)
    wait_until(lambda: len(dead_letters()) == 4 and store.versions(), 90, "4 dead letters and a snapshot", log)
    first.send_signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    assert store.manifest(store.latest_version()).offsets[0]["offset"] == 4000  # the poison lies beyond it

    produce_samples(s, good[6000:])
    second = start_trainer(env, log, "--idle-exit", "4")
    assert second.wait(120) == 0, log.read_text()[-3000:]
    final = store.manifest(store.latest_version())
    assert (final.samples_seen, final.sample_digest) == (len(good), digest(good))
    assert final.dead_lettered == 4
    dead = dead_letters()
    assert len(dead) == 4, [d["reason"] for d in dead]  # read twice, written once
    assert sorted(d["key"] for d in dead)[1:] == [b"sample:s90000", b"sample:s90001", b"sample:s90002"]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_newest_snapshot_is_skipped_at_start(settings: Settings, tmp_path: Path, damage: str,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    s = trainer_settings(settings, tmp_path)
    samples = make_samples(5000)
    produce_samples(s, samples[:4000])
    TrainerService.from_settings(s).run(idle_exit_s=2.0)
    store = SnapshotStore(s.trainer.snapshot_dir)
    newest, previous = store.versions()[-1], store.versions()[-2]
    apply, reason = DAMAGE[damage]
    apply(store, newest)

    produce_samples(s, samples[4000:])
    restarted = TrainerService.from_settings(s)
    with caplog.at_level("WARNING", logger="rtrec.trainer"):
        summary = restarted.run(idle_exit_s=2.0)
    assert summary.resumed_from == previous
    assert reason in caplog.text and f"resumed from v{previous}, the newest intact snapshot" in caplog.text
    final = store.manifest(store.latest_version())
    assert (final.samples_seen, final.sample_digest) == (5000, digest(samples))


def test_rollback_to_a_damaged_snapshot_is_one_clear_line(settings: Settings, tmp_path: Path) -> None:
    s = trainer_settings(settings, tmp_path)
    produce_samples(s, make_samples(4000))
    summary = TrainerService.from_settings(s).run(idle_exit_s=2.0)
    pickled_objects(SnapshotStore(s.trainer.snapshot_dir), summary.snapshots[0])
    result = CliRunner().invoke(cli, ["model", "rollback", "--to", str(summary.snapshots[0])], env=env_of(s))
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"Error: snapshot v{summary.snapshots[0]}: weights.npz holds pickled Python objects; refused (loading them "
        "could run code)"]


def test_a_full_snapshot_disk_is_reported_leaves_no_debris_and_training_goes_on(
        settings: Settings, tmp_path: Path, small_disk: Path, caplog: pytest.LogCaptureFixture) -> None:
    snapshots = small_disk / "snapshots"
    # 4096 x 32 embeddings x 4 copies x 2 tables ~ 4 MB: a snapshot cannot fit in 2 MB; 512 x 8 ~ 130 kB can
    s = trainer_settings(settings, tmp_path, snapshot_dir=snapshots, user_buckets=512, item_buckets=512,
                         embedding_dim=8, snapshot_every_samples=1000)
    samples = make_samples(6000)
    produce_samples(s, samples[:3000])
    filler = small_disk / "filler"
    TrainerService.from_settings(s).run(idle_exit_s=2.0)  # fits: the disk is still empty
    written = SnapshotStore(snapshots).versions()
    free = shutil.disk_usage(small_disk).free
    filler.write_bytes(b"\0" * (free - 20_000))  # about 20 kB left: the next snapshot cannot fit

    produce_samples(s, samples[3000:])
    trainer = TrainerService.from_settings(s)
    with caplog.at_level("ERROR", logger="rtrec.trainer"):
        trainer.run(idle_exit_s=2.0)
    assert "was not written" in caplog.text and "No space left on device" in caplog.text
    assert trainer.publisher.failures >= 1
    assert not [p for p in snapshots.iterdir() if p.name.startswith(".tmp")]  # no debris keeps the disk full
    assert SnapshotStore(snapshots).versions() == written  # nothing half-written became a version

    filler.unlink()  # space again: the next start publishes what the failed ones held
    summary = TrainerService.from_settings(s).run(idle_exit_s=2.0)
    final = SnapshotStore(snapshots).manifest(summary.snapshots[-1])
    assert (final.samples_seen, final.sample_digest) == (6000, digest(samples))


def test_sigterm_writes_a_final_snapshot_and_the_restart_trains_nothing_twice(settings: Settings,
                                                                            tmp_path: Path) -> None:
    s = trainer_settings(settings, tmp_path)
    samples = make_samples(20_000)
    produce_samples(s, samples[:10_000])
    env = subprocess_env(s, tmp_path, RTREC_TRAINER__SNAPSHOT_EVERY_SAMPLES="1000000",
                         RTREC_TRAINER__SNAPSHOT_EVERY_S="600")  # no snapshot but the final one
    log = tmp_path / "trainer.log"
    store = SnapshotStore(s.trainer.snapshot_dir)
    first = start_trainer(env, log)
    wait_until(lambda: "consuming" in log.read_text() or first.poll() is not None, 60, "the trainer start", log)
    time.sleep(3)  # training under way
    first.send_signal(signal.SIGTERM)
    assert first.wait(60) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "SIGTERM received: finishing" in text
    assert len(store.versions()) == 1  # the final snapshot, written on SIGTERM
    final = store.manifest(store.latest_version())
    assert 0 < final.samples_seen <= 10_000

    produce_samples(s, samples[10_000:])
    second = start_trainer(env, log, "--idle-exit", "4")
    assert second.wait(120) == 0, log.read_text()[-3000:]
    last = store.manifest(store.latest_version())
    assert last.parent == final.version
    assert (last.samples_seen, last.sample_digest) == (20_000, digest(samples))  # nothing twice, nothing lost
