"""The demo's trainer in a process of its own, against the real broker: what it reports is what it did."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from core.settings import Settings
from gpu_trainer.batch import hash_ids
from gpu_trainer.snapshots import SnapshotStore
from rtrec.demo_trainer import NICENESS, TrainerProcess
from tests.gpu_trainer.samples import digest, make_samples, produce_samples
from tests.gpu_trainer.test_service_kafka import trainer_settings

pytestmark = pytest.mark.integration


def test_the_trainer_process_trains_every_sample_once_and_reports_what_it_did(settings: Settings,
                                                                              tmp_path: Path) -> None:
    s = trainer_settings(settings, tmp_path)
    samples = make_samples(3000)
    produce_samples(s, samples)
    trainer = TrainerProcess(s)
    trainer.start()
    deadline = time.monotonic() + 120
    while trainer.samples_trained < len(samples) and time.monotonic() < deadline:
        assert trainer.is_alive()
        time.sleep(0.2)
    assert trainer.newest_event_ms == max(x["event_time"] for x in samples)
    assert os.getpriority(os.PRIO_PROCESS, trainer._process.pid) >= NICENESS  # the feature path comes first
    outcome = trainer.stop()
    assert outcome.error is None and not trainer.is_alive()
    assert outcome.samples_trained == len(samples)
    store = SnapshotStore(s.trainer.snapshot_dir)
    assert outcome.written == store.versions() and outcome.promoted
    last = store.manifest(outcome.written[-1])  # the final snapshot, written before it stopped
    assert last.samples_seen == len(samples) and last.sample_digest == digest(samples)
    # each sample scored once, before it was learnt from
    ids = np.array([x["sample_id"] for x in samples], dtype=object)
    assert sorted(outcome.scores["sample_hash"].tolist()) == sorted(hash_ids(ids).tolist())
    assert outcome.scores["label"].sum() == sum(x["label"] for x in samples)


def test_a_trainer_process_that_dies_is_reported_with_its_exit_code(settings: Settings, tmp_path: Path) -> None:
    s = trainer_settings(settings, tmp_path)
    produce_samples(s, make_samples(500))
    trainer = TrainerProcess(s)
    trainer.start()
    deadline = time.monotonic() + 120
    while trainer.samples_trained < 500 and time.monotonic() < deadline:
        time.sleep(0.2)
    os.kill(trainer._process.pid, signal.SIGKILL)
    began = time.monotonic()
    outcome = trainer.stop(timeout_s=120)
    assert outcome.error == "the trainer process ended with exit code -9 and no outcome"
    assert time.monotonic() - began < 10 and not trainer.is_alive()
